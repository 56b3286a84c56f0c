"""libjpeg's warnings, caught: a JPEG whose compressed data is damaged is refused, not trained on.

Runs wherever an image is decoded: the preparation's decode workers and the in-process
reference pipeline (both through ``decode.decode_bgr``).

A JPEG damaged in the middle (its start and end markers intact) decodes without an error:
libjpeg fills what it cannot read with guesses and says so only as a warning, printed by its
default ``output_message`` to the process's file descriptor 2 ("Corrupt JPEG data: 102
extraneous bytes before marker 0xd9", "Premature end of JPEG file"). OpenCV's ``imread``
neither raises nor reports it, and Pillow decodes the same files silently, so the only
reliable witness is that text. ``capture_fd2`` points descriptor 2 at an in-memory file
(``memfd_create``) for the length of one call and hands back what was written there.

Cost: a handful of system calls per image (dup, two dup2, close, lseek), 8-11 µs measured
against 1.7-8 ms for the decode itself (``bench/prepare.py --what decode-warnings``). The decode is the
same call as before, so the bytes of every good image are unchanged (parity holds).

Caveats, by design: descriptor 2 is process-wide, so while a decode runs, text another
thread writes to it lands in the capture too; it is written back to the real descriptor 2
afterwards, unless it is one of the warnings below. Calls are serialised by a lock.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Callable, TypeVar

T = TypeVar("T")

# libjpeg(-turbo)'s warnings that mean the pixels are guesses (jerror.h: JWRN_EXTRANEOUS_DATA,
# JWRN_HIT_MARKER, JWRN_HUFF_BAD_CODE, JWRN_ARITH_BAD_CODE, JWRN_MUST_RESYNC, JWRN_JPEG_EOF).
# Not "bad ICC marker" (the colour profile, not the pixels) nor the JFIF/Adobe notes.
_CORRUPT_PREFIXES = ("Corrupt JPEG data", "Premature end of JPEG file")
_HARMLESS = ("bad ICC marker",)
_MAX_CAPTURE_NBYTES = 1 << 16  # libjpeg prints only its first warning per image

_lock = threading.Lock()
_capture: dict[int, int] = {}  # pid -> memfd, so a forked child makes its own


def _capture_fd() -> int:
    fd = _capture.get(os.getpid())
    if fd is None:
        try:
            fd = os.memfd_create("pixpool-decoder-messages", os.MFD_CLOEXEC)
        except OSError:  # memfd refused (seccomp, old kernel): an unlinked temporary file does the same
            import tempfile

            with tempfile.TemporaryFile() as f:
                fd = os.dup(f.fileno())
        _capture[os.getpid()] = fd
    return fd


def capture_fd2(call: Callable[[], T]) -> tuple[T, str]:
    """``call()`` with file descriptor 2 captured: (its result, the text written to fd 2)."""
    with _lock:
        cap = _capture_fd()
        try:
            sys.stderr.flush()  # Python's own buffered text goes to the real stderr first
        except (AttributeError, ValueError, OSError):
            pass
        saved = os.dup(2)
        try:
            os.dup2(cap, 2)
            try:
                result = call()
            finally:
                os.dup2(saved, 2)
        finally:
            os.close(saved)
        written = os.lseek(cap, 0, os.SEEK_CUR)
        if not written:
            return result, ""
        text = os.pread(cap, min(written, _MAX_CAPTURE_NBYTES), 0).decode("utf-8", "replace")
        os.ftruncate(cap, 0)
        os.lseek(cap, 0, os.SEEK_SET)
    return result, text


def split_corrupt(text: str) -> tuple[list[str], str]:
    """(libjpeg warnings that mean corrupt pixel data, every other line of ``text`` as it was)."""
    corrupt, other = [], []
    for line in text.splitlines(keepends=True):
        stripped = line.strip()
        if stripped.startswith(_CORRUPT_PREFIXES) and not any(h in stripped for h in _HARMLESS):
            corrupt.append(stripped)
        else:
            other.append(line)
    return corrupt, "".join(other)


def pass_through(text: str) -> None:
    """Write ``text`` (captured from someone else) to the real file descriptor 2."""
    data = text.encode("utf-8", "replace")
    while data:
        try:
            data = data[os.write(2, data) :]
        except OSError:
            return
