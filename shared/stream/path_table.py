"""``PathTable``: many file paths held as one byte buffer and one offsets array.

Code both sides import: the daemon keeps its records' image paths in one (a COCO-sized set
has 118k of them: as a list of Python strings that is ~100 bytes of objects per path, in one
buffer it is the path's own bytes plus 8), serves them to trainers in pages of raw bytes
(``wire.trainer``'s ``records`` with ``packed``), and a trainer keeps what it receives the same way.

Paths are encoded as UTF-8 with ``surrogateescape`` (a file name that is not UTF-8 survives the
round trip) and each is followed by one NUL byte, which no POSIX path contains, so a page of
the buffer is itself a valid packed form. ``table[i]`` decodes one path when asked.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

_SEP = b"\0"


def encode_path(path: str) -> bytes:
    return path.encode("utf-8", "surrogateescape")


class PathTable:
    """A read-only sequence of paths over ``data`` (NUL-terminated paths back to back) and
    ``offsets`` (int64, n + 1: path i is ``data[offsets[i]:offsets[i + 1] - 1]``)."""

    __slots__ = ("data", "offsets")

    def __init__(self, data: bytes, offsets: np.ndarray):
        offsets = np.asarray(offsets, dtype=np.int64)
        if offsets.ndim != 1 or len(offsets) < 1 or offsets[0] != 0 or offsets[-1] != len(data):
            raise ValueError(f"PathTable offsets must run from 0 to {len(data)} (the data's length)")
        self.data = bytes(data)
        self.offsets = offsets

    @classmethod
    def from_paths(cls, paths: Iterable[str]) -> PathTable:
        encoded = [encode_path(p) for p in paths]
        for raw in encoded:
            if _SEP in raw:
                raise ValueError(f"a path holds a NUL byte: {raw[:80]!r}")
        return cls.from_packed(b"".join(raw + _SEP for raw in encoded))

    @classmethod
    def from_packed(cls, data: bytes) -> PathTable:
        """From NUL-terminated paths back to back (``page``'s bytes, or several pages joined)."""
        if data and not data.endswith(_SEP):
            raise ValueError("packed paths must each end with a NUL byte")
        ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 0) + 1
        return cls(data, np.concatenate([np.zeros(1, np.int64), ends.astype(np.int64)]))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> str:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"path {i} out of range for a table of {n}")
        i %= n
        start, end = int(self.offsets[i]), int(self.offsets[i + 1]) - 1
        return self.data[start:end].decode("utf-8", "surrogateescape")

    def __iter__(self):
        return iter(self.tolist())

    def tolist(self, start: int = 0, stop: int | None = None) -> list[str]:
        """Paths ``start .. stop`` (default all) as strings."""
        n = len(self)
        stop = n if stop is None else min(stop, n)
        if not 0 <= start < stop:
            return []
        raw = self.data[int(self.offsets[start]) : int(self.offsets[stop]) - 1]
        return raw.decode("utf-8", "surrogateescape").split("\0")

    def page(self, start: int, max_bytes: int, max_count: int | None = None) -> tuple[bytes, int]:
        """(packed bytes, count): the paths from ``start`` on that fit in ``max_bytes`` (at
        least one, whatever its length), at most ``max_count`` of them, for one ``records`` reply."""
        n = len(self)
        if not 0 <= start <= n:
            raise IndexError(f"page from {start} of a table of {n}")
        if start == n:
            return b"", 0
        base = int(self.offsets[start])
        end = int(np.searchsorted(self.offsets, base + max_bytes, side="right")) - 1
        end = min(n, max(end, start + 1))
        if max_count is not None:
            end = min(end, start + max(1, int(max_count)))
        return self.data[base : int(self.offsets[end])], end - start

    @property
    def nbytes(self) -> int:
        return len(self.data) + self.offsets.nbytes

    def __eq__(self, other) -> bool:
        if isinstance(other, PathTable):
            return self.data == other.data
        return NotImplemented

    __hash__ = None

    def __repr__(self) -> str:
        return f"PathTable({len(self)} paths, {self.nbytes} bytes)"
