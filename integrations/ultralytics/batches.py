"""One pixpool batch -> the dict Ultralytics' detect loss and trainer read.

Runs in the trainer process; imports torch and Pillow, not Ultralytics. The layout is the
one Ultralytics' ``YOLODataset.collate_fn`` produces for the detect task:

- ``img``: uint8 (B, 3, S, S) RGB tensor (``DetectionTrainer.preprocess_batch`` moves it to
  the device and divides by 255). From ``PixpoolDetectionTrainer``'s stream
  (``zero_copy=True``) it is the ring slot itself, not a copy: valid until the next batch is
  asked for, which is how Ultralytics' loop uses it (``preprocess_batch`` replaces it with
  a float copy at once).
- ``cls`` float32 (n, 1), ``bboxes`` float32 (n, 4) normalised ``cx, cy, w, h``,
  ``batch_idx`` float32 (n,): copies of the slot's target rows (a few hundred bytes).
- ``im_file``: tuple of B image paths; ``ori_shape``: tuple of B ``(h, w)`` of the decoded
  files (EXIF orientation applied, as ``cv2.imread`` does); ``resized_shape``: ``(S, S)``
  each; ``ratio_pad``: the long-side resize gains, as Ultralytics' ``load_image`` gives them.
  For a mosaic these describe the sample's own record, as Ultralytics' do for its first tile.
"""

from __future__ import annotations

import math
from typing import Any

from PIL import Image

_ORIENTATION_TAG = 0x0112
_TRANSPOSED = {5, 6, 7, 8}  # EXIF orientations that swap height and width


def decoded_shape(path: str) -> tuple[int, int]:
    """(height, width) of an image as ``cv2.imread`` decodes it, from its header alone."""
    with Image.open(path) as im:
        w, h = im.size
        if im.getexif().get(_ORIENTATION_TAG, 1) in _TRANSPOSED:
            w, h = h, w
    return h, w


def resize_gain(shape: tuple[int, int], imgsz: int) -> tuple[float, float]:
    """(h, w) gains of resizing the long side to ``imgsz`` (Ultralytics' ``load_image`` rounding)."""
    h0, w0 = shape
    r = imgsz / max(h0, w0)
    if r == 1:
        return 1.0, 1.0
    h, w = min(math.ceil(h0 * r), imgsz), min(math.ceil(w0 * r), imgsz)
    return h / h0, w / w0


class ShapeCache:
    """``decoded_shape`` per file, read once per file (a header read each, on first use)."""

    def __init__(self) -> None:
        self._shapes: dict[str, tuple[int, int]] = {}

    def __call__(self, path: str) -> tuple[int, int]:
        shape = self._shapes.get(path)
        if shape is None:
            shape = self._shapes[path] = decoded_shape(path)
        return shape


def to_ultralytics(
    images: Any, targets: Any, files: list[str], *, imgsz: int, shapes: ShapeCache, single_cls: bool = False
) -> dict[str, Any]:
    """The Ultralytics batch dict of one pixpool batch (``images`` uint8 (B,3,S,S), ``targets`` (n,6))."""
    cls = targets[:, 1:2].clone()
    if single_cls:
        cls.zero_()
    ori = tuple(shapes(f) for f in files)
    return {
        "batch_idx": targets[:, 0].clone(),
        "bboxes": targets[:, 2:6].clone(),
        "cls": cls,
        "im_file": tuple(files),
        "img": images,
        "ori_shape": ori,
        "ratio_pad": tuple(resize_gain(s, imgsz) for s in ori),
        "resized_shape": tuple((imgsz, imgsz) for _ in files),
    }
