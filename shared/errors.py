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


class RingGoneError(SnapshotError):
    """A trainer's batch ring no longer exists: the daemon removed it (its trainer detached) or stopped."""


class SnapshotChangedError(SnapshotError):
    """A trainer attached again (its daemon was restarted) and the daemon now serves another
    snapshot than the one the trainer's stream began on: other images, records or classes.

    ``before`` and ``after`` are the two snapshots' identities as the attach replies carried
    them (``fingerprint``, ``name``, ``records``, ``names``). Raised unless the trainer asked
    to follow the daemon (``attach(..., follow_snapshot=True)``, ``pixpool train --follow-snapshot``)."""

    def __init__(self, message: str, *, before: dict, after: dict):
        super().__init__(message)
        self.before = before
        self.after = after


class UntrustedSegmentError(SnapshotError, PermissionError):
    """A file in /dev/shm under a pixpool name that pixpool must not map: another user's,
    writable by others, a link, or of the wrong size. ``path`` names it."""

    def __init__(self, message: str, *, path: str | None = None):
        super().__init__(message)
        self.path = path


class ConfigError(PixpoolError, ValueError):
    """A setting is out of range or of the wrong type (message names the field).

    Made with ``for_field`` where one field is at fault: the message then speaks Python
    (``field 'mosaic' = 2.0 is out of range ...``) and ``cli_message`` says the same with
    the command-line flag, which is what the CLI prints.
    """

    def __init__(self, message: str, *, field: str | None = None, value: object = None, problem: str | None = None):
        super().__init__(message)
        self.field = field
        self.value = value
        self.problem = problem

    @classmethod
    def for_field(cls, field: str, value: object, problem: str) -> "ConfigError":
        """``problem`` completes "field 'x' = v ...", e.g. "is out of range; use 0 to 1".

        It may name other settings as ``{name}``: Python messages show the field name,
        the CLI the flag (``cli_message``)."""
        text = problem.format_map(_Names())
        return cls(f"field {field!r} = {value!r} {text}", field=field, value=value, problem=problem)

    def cli_message(self, flags: dict[str, str]) -> str:
        """The message in flags (``flags``: field -> flag), keeping the field's name."""
        if self.field is None or self.problem is None or self.field not in flags:
            return str(self)
        text = self.problem.format_map(_Names(flags))
        return f"{flags[self.field]} {self.value!r} {text} (field {self.field!r})"


class _Names(dict):
    """Formats ``{name}`` in a problem text as the name itself, or as its flag where known."""

    def __init__(self, flags: dict[str, str] | None = None):
        super().__init__()
        self.flags = flags or {}

    def __missing__(self, key: str) -> str:
        return self.flags.get(key, key)


class DatasetMismatchError(ConfigError):
    """A trainer named its data (``attach(data=)``, ``pixpool train --data``, ``pixpool yolo
    train data=``) and the daemon it found serves another dataset (other image sources,
    classes or task), or cannot say which it serves. ``asked`` and ``served`` are the two
    descriptions (``shared/stream/served_data.py``); the message names both and what to do."""

    def __init__(self, message: str, *, asked: dict, served: dict):
        super().__init__(message, field="data")
        self.asked = asked
        self.served = served


class ProtocolError(PixpoolError, ValueError):
    """A message does not follow the wire protocol (version, shape, size, order).

    ``field`` names the message field at fault where one is (it travels in the ``error``
    reply, so the trainer sees which of its fields the daemon refused)."""

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.field = field


class NotAuthorized(PixpoolError, PermissionError):
    """The daemon does not admit this client's CURVE key (it is not, or no longer, in the
    daemon's ``authorized/`` folder); the message names the key file and what to do."""


class RenderError(PixpoolError, RuntimeError):
    """A batch failed in an augmentation worker (the message carries the worker's error)."""


class MissingExtraError(PixpoolError, ImportError):
    """A command or module needs an optional dependency that is not installed; the message
    names the extra to install (e.g. ``pip install 'pixpool[train]'`` for torch)."""


class DaemonStopped(PixpoolError, ConnectionError):
    """The daemon went away or refused the trainer; the message says why."""


class DaemonTimeout(PixpoolError, TimeoutError):
    """No daemon answered within the allowed time."""


class DaemonNotFound(DaemonTimeout):
    """No daemon listens where the trainer looked: the socket directory does not exist, holds
    no ``daemon.sock``, or only one a killed daemon left, and no daemon there says it is
    starting. Raised within a second (a ``DaemonTimeout`` of zero seconds, so code that caught
    the old wait still catches it) unless the trainer asked to wait (``wait_s``). ``socket_dir`` names it."""

    def __init__(self, message: str, *, socket_dir: str | None = None):
        super().__init__(message)
        self.socket_dir = socket_dir


class ClosedError(PixpoolError, RuntimeError):
    """A ``Client`` or a loader was used after ``close()`` (or after its ``with`` block)."""
