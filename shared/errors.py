"""The project's error tree.

One root, ``PixpoolError``. Each subclass also inherits the built-in it resembles, so a
caller that already handles ``ValueError`` or ``FileNotFoundError`` keeps working. Every
message says what happened, the numbers or the file, and what to change.
"""

from __future__ import annotations


class PixpoolError(Exception):
    """Root of every error pixpool raises on purpose."""


class DatasetError(PixpoolError, ValueError):
    """The dataset (annotation file, label file, image) is malformed.

    ``path`` names the offending file and ``line`` the 1-based line where one applies.
    """

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None):
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        super().__init__(where + message)
        self.path = path
        self.line = line


class MissingFileError(DatasetError, FileNotFoundError):
    """A file the dataset refers to does not exist."""


class ImageDecodeError(DatasetError):
    """An image file exists but cannot be decoded."""


class CapacityError(PixpoolError, MemoryError):
    """/dev/shm or memory cannot hold what was asked for (message gives both byte counts)."""


class SnapshotError(PixpoolError, RuntimeError):
    """A snapshot segment is missing, incomplete or of another format version."""


class ConfigError(PixpoolError, ValueError):
    """A setting is out of range or of the wrong type (message names the field)."""


class ProtocolError(PixpoolError, ValueError):
    """A message does not follow the wire protocol (version, shape, size, order)."""


class DaemonStopped(PixpoolError, ConnectionError):
    """The daemon went away or refused the trainer; the message says why."""


class DaemonTimeout(PixpoolError, TimeoutError):
    """No daemon answered within the allowed time."""
