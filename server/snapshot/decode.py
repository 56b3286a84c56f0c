"""Decoding an image file into the prepared form: resized 8-bit BGR, then centred float32.

Runs in the preparation workers and in the in-process reference pipeline; both call the
same three functions, which is what makes the snapshot path and the reference path agree
byte for byte.

Every input becomes 3-channel 8-bit BGR: grayscale is replicated, alpha is dropped (not
composited), 16-bit samples are scaled to 8 bits, CMYK JPEGs are converted by libjpeg, and
the EXIF orientation is applied (OpenCV's ``IMREAD_COLOR`` default), so labels are read
in the orientation a viewer shows. A JPEG that libjpeg decodes only with a warning about
damaged data is refused by name (``decoder_warnings``).
"""

from __future__ import annotations

import math
import os

import cv2
import numpy as np

from ...shared.errors import ImageDecodeError, MissingFileError
from ...shared.stream.config import FILL_VALUE
from .decoder_warnings import capture_fd2, pass_through, split_corrupt

# Decoding runs one image per process; OpenCV's own thread pool would only oversubscribe
# the cores the preparation pool already uses.
cv2.setNumThreads(1)


def decode_bgr(path: str) -> np.ndarray:
    """Decode ``path`` into an 8-bit BGR (h, w, 3) array, or raise naming the file."""
    if not os.path.isfile(path):
        raise MissingFileError(
            "image file does not exist; check the images folder or the annotation's file_name", path=path
        )
    image, messages = capture_fd2(lambda: cv2.imread(path, cv2.IMREAD_COLOR))
    corrupt, other = split_corrupt(messages)
    if other:
        pass_through(other)
    if corrupt:
        raise ImageDecodeError(
            f"the JPEG's compressed data is damaged (libjpeg: {corrupt[0]}): it decodes only with "
            "the damaged part guessed, and pixpool would train on the guesses; re-download or "
            "re-encode the file, or remove it",
            path=path,
        )
    if image is None or image.size == 0:
        raise ImageDecodeError(
            "cannot decode image (corrupt, truncated or not an image); replace or remove it", path=path
        )
    if image.dtype != np.uint8:  # defensive: IMREAD_COLOR already yields 8-bit
        image = (image >> 8).astype(np.uint8) if image.dtype == np.uint16 else image.astype(np.uint8)
    return image


def resized_hw(height: int, width: int, imgsz: int) -> tuple[int, int]:
    """Size after resizing the long side to ``imgsz`` with the aspect kept."""
    r = imgsz / max(height, width)
    if r == 1:
        return height, width
    return min(math.ceil(height * r), imgsz), min(math.ceil(width * r), imgsz)


def resize_long_side(image: np.ndarray, imgsz: int) -> np.ndarray:
    """Resize so the long side is ``imgsz`` (linear interpolation); a no-op when it already is."""
    h, w = image.shape[:2]
    nh, nw = resized_hw(h, w, imgsz)
    if (nh, nw) == (h, w):
        return image
    return cv2.resize(image, (nw, nh), interpolation=cv2.INTER_LINEAR)


def centre(image: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """float32 copy of ``image`` minus the fill value; never writes ``image``.

    ``out`` (float32, same shape) receives the result in place: preparation centres a band
    of rows at a time into one reused buffer before writing it to the arena, so it holds
    no transient float copy of a whole image.
    """
    return np.subtract(image, np.float32(FILL_VALUE), out=out, dtype=np.float32)


def prepare_image(path: str, imgsz: int) -> np.ndarray:
    """Decode, resize and centre one image: what the snapshot stores for one record."""
    return centre(resize_long_side(decode_bgr(path), imgsz))
