"""Image sizes from file headers, fast: a JPEG's frame header read directly, Pillow for the rest.

Runs wherever a snapshot's size is worked out before anything is decoded: the preparing process
(``prepare._plan``, through ``header_size_hw``), ``pixpool plan`` and the daemon's check at
start-up (``plan.py``), and the processes ``header_sizes`` spawns for a large set.

Why a parser of its own: Pillow's ``Image.open`` + ``getexif`` costs 60-100 us a JPEG (it builds an
image object, parses every table), a third of that is the file read; a 100k-image set spent 6-10 s
before its size was known. ``jpeg_size_hw`` walks the markers to the frame header (SOF) and reads
the EXIF orientation from IFD0, and answers only where the answer is certainly Pillow's: any
file it does not fully understand (another format, a second EXIF or an XMP segment, an MPO, a
frame type other than baseline/extended/progressive Huffman, padding between markers, a size
over Pillow's ``MAX_IMAGE_PIXELS``, a missing end-of-image marker) returns None and is read by
Pillow, which also gives every refusal its words (``header_size_hw``).
"""

from __future__ import annotations

import os
import struct

from ...shared.errors import ImageDecodeError, MissingFileError

__all__ = ["jpeg_size_hw", "header_size_hw", "header_sizes"]

_SOI = b"\xff\xd8\xff"
_EOI = b"\xff\xd9"
_SOF = {0xC0, 0xC1, 0xC2}  # baseline, extended, progressive Huffman: what cameras and encoders write
_SOS = 0xDA
_APP1 = 0xE1
_APP2 = 0xE2
_XMP = b"http://ns.adobe.com/xap/1.0/\x00"  # the APP1 Pillow reads an XMP orientation from
_CHUNK = 4096  # most headers end within it; a larger EXIF or ICC segment reads on
_SWAP_ORIENTATIONS = {5, 6, 7, 8}  # transposes: width and height trade places
_ORIENTATION_TAG = 0x0112


def jpeg_size_hw(path: str) -> tuple[int, int] | None:
    """(height, width) after EXIF orientation of the JPEG at ``path``, or None where Pillow must
    decide (module docstring); never raises for a bad file (Pillow will, naming it)."""
    # Plain descriptors and pread: Python's buffered file object costs more than the reads.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        buf = os.read(fd, _CHUNK)
        if not buf.startswith(_SOI):
            return None
        found = _walk(fd, buf)
        if found is None:
            return None
        end = os.fstat(fd).st_size
        if end < 4 or os.pread(fd, 2, end - 2) != _EOI:
            return None  # truncated: Pillow's path refuses it by name
    except OSError:
        return None
    finally:
        os.close(fd)
    h, w, orientation = found
    if not h or not w or h * w > _max_pixels():
        return None
    return (w, h) if orientation in _SWAP_ORIENTATIONS else (h, w)


def _walk(fd: int, buf: bytes) -> tuple[int, int, int] | None:
    """(height, width, orientation) from the markers up to the start of scan, or None. Reads the
    file in small chunks and skips the segments it does not need (an ICC profile, a Photoshop
    block: tens of KB) without reading them."""
    pos, base, size, exif = 2, 0, None, None  # base: the file offset of buf[0]
    while True:
        if pos + 4 > len(buf):
            base, pos = base + pos, 0
            buf = os.pread(fd, _CHUNK, base)
            if len(buf) < 4:
                return None
        if buf[pos] != 0xFF:
            return None  # junk between segments: Pillow skips it, this does not guess
        marker = buf[pos + 1]
        if marker == _SOS:
            break
        if marker < 0xC0 or marker in (0xD8, 0xD9) or 0xD0 <= marker <= 0xD7 or marker == 0xFF:
            return None  # padding, a restart marker or another marker without a length before the scan
        length = (buf[pos + 2] << 8) | buf[pos + 3]
        if length < 2:
            return None
        end = pos + 2 + length
        needed = marker in (_APP1, _APP2) or 0xC0 <= marker <= 0xCF
        if needed and end > len(buf):
            base, pos = base + pos, 0
            buf = os.pread(fd, max(_CHUNK, 2 + length), base)
            end = 2 + length
            if end > len(buf):
                return None
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # a frame header (Pillow's SOF set)
            body = buf[pos + 4 : end]
            if marker not in _SOF or size is not None or len(body) < 6 or body[0] != 8 or body[5] not in (1, 3, 4):
                return None  # another frame type, a second frame, or what Pillow refuses: its words
            size = struct.unpack_from(">HH", body, 1)
        elif marker == _APP1:
            body = buf[pos + 4 : end]
            if body.startswith(_XMP) or (body.startswith(b"Exif\0\0") and exif is not None):
                return None  # XMP (Pillow reads an orientation there too) or a second EXIF (it joins them)
            if body.startswith(b"Exif\0\0"):
                exif = body[6:]
        elif marker == _APP2 and buf.startswith(b"MPF\0", pos + 4):
            return None  # a multi-picture file: Pillow opens it as MPO
        pos = end
    if size is None:
        return None
    orientation = 1 if exif is None else _orientation(exif)
    if orientation is None:
        return None
    return size[0], size[1], orientation


def _orientation(tiff: bytes) -> int | None:
    """IFD0's orientation (1 when absent) of the TIFF structure of an EXIF segment, or None where
    it is not plainly one SHORT or LONG value (Pillow decides those)."""
    if len(tiff) < 8 or tiff[:2] not in (b"II", b"MM"):
        return None
    e = "<" if tiff[:2] == b"II" else ">"
    magic, ifd = struct.unpack_from(e + "HI", tiff, 2)
    if magic != 42 or ifd < 8 or ifd + 2 > len(tiff):
        return None
    (count,) = struct.unpack_from(e + "H", tiff, ifd)
    if ifd + 2 + 12 * count > len(tiff):
        return None
    found = None
    for k in range(count):
        tag, kind, n = struct.unpack_from(e + "HHI", tiff, ifd + 2 + 12 * k)
        if tag != _ORIENTATION_TAG:
            continue
        if found is not None or n != 1 or kind not in (3, 4):
            return None
        found = struct.unpack_from(e + ("H" if kind == 3 else "I"), tiff, ifd + 2 + 12 * k + 8)[0]
    return 1 if found is None else found


def _max_pixels() -> int:
    from PIL import Image  # imported once per process; the limit is read each time (a caller may set it)

    return Image.MAX_IMAGE_PIXELS or (1 << 62)


# Below this many files one process reads them all: a spawned reader costs 0.3-0.5 s to start.
def header_size_hw(path: str) -> tuple[int, int]:
    """(height, width) after EXIF orientation, from the file's header only (no decode).

    Also refuses, before anything is allocated, what a decoder would accept silently: a
    JPEG without its end-of-image marker (cut off: OpenCV pads the missing rows with grey
    and says nothing), and a header claiming more pixels than Pillow's decompression-bomb
    limit (``Image.MAX_IMAGE_PIXELS`` x 2). A plain JPEG is answered by ``jpeg_size_hw``
    (its frame header, a third of Pillow's time), which leaves every other file, and every
    refusal, to Pillow here."""
    fast = jpeg_size_hw(path)
    if fast is not None:
        return fast
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            w, h = im.size
            fmt = im.format
            # cv2's IMREAD_COLOR applies an EXIF orientation wherever the file carries one
            # (JPEG, PNG eXIf, WebP); a disagreement is caught after decoding, naming the file.
            orientation = im.getexif().get(0x0112, 1)
            if fmt == "JPEG":
                _check_jpeg_end(im.fp, path)
    except FileNotFoundError:
        raise MissingFileError(
            "image file does not exist; check the images folder or the annotation's file_name", path=path
        ) from None
    except Image.DecompressionBombError as exc:
        raise ImageDecodeError(
            f"the image header claims too many pixels ({exc}); pixpool refuses images over {2 * Image.MAX_IMAGE_PIXELS} pixels "
            "(a decompression bomb, or a header that lies); replace or remove the file",
            path=path,
        ) from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise ImageDecodeError(f"cannot read the image header ({exc}); replace or remove the file", path=path) from None
    if orientation in _SWAP_ORIENTATIONS:
        w, h = h, w
    return h, w


def _check_jpeg_end(fp, path: str) -> None:
    fp.seek(-2, os.SEEK_END)
    if fp.read(2) != _EOI:
        raise ImageDecodeError(
            "the JPEG ends without its end-of-image marker (FFD9): the file is truncated (its bottom is cut off) "
            "and would be trained on padded with grey; re-download or re-encode it, or remove it",
            path=path,
        )


_PARALLEL_FROM = 20_000


def header_sizes(paths: list[str], *, processes: int = 1) -> list[tuple[int, int]]:
    """(height, width) after EXIF orientation of each of ``paths`` (``header_size_hw``:
    its refusals, naming the file, included), in order; a large list is read by ``processes``
    spawned processes in contiguous runs (module docstring)."""
    if processes <= 1 or len(paths) < _PARALLEL_FROM:
        return [header_size_hw(p) for p in paths]
    from concurrent.futures import ProcessPoolExecutor

    from ...shared.transport.spawn import spawn_context

    step = -(-len(paths) // processes)
    runs = [paths[i : i + step] for i in range(0, len(paths), step)]
    with ProcessPoolExecutor(len(runs), mp_context=spawn_context()) as pool:
        parts = list(pool.map(_read_run, runs))
    return [hw for part in parts for hw in part]


def _read_run(paths: list[str]) -> list[tuple[int, int]]:
    """One spawned reader's run: this module alone (no numpy, no OpenCV), Pillow only for a
    file the fast path leaves to it."""
    return [header_size_hw(p) for p in paths]
