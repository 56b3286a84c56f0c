"""The error codes: which exception an ``error`` reply stands for, on both sides of the wire.

Runs in both processes. The daemon turns an exception it raised while handling a request into
an ``error`` reply (``error_frame_for``: the code of its class, its message, the refused field);
the client raises the class of that code with the daemon's message again (``error_from``), so
``except CapacityError`` works across the wire. Every code is declared once, in
``ERROR_CODES``; an ``error`` reply is a trainer-protocol reply (``trainer``).
"""

from __future__ import annotations

from typing import Any

from ..errors import (
    CapacityError,
    ConfigError,
    DaemonStopped,
    DatasetError,
    NotAuthorized,
    PixpoolError,
    ProtocolError,
    RenderError,
    SnapshotError,
)
from .trainer import Op, encode_reply

__all__ = ["ERROR_CODES", "MAX_ERROR_CHARS", "as_error", "code_for", "error_frame", "error_frame_for", "error_from"]

# Longest ``error`` message sent (characters; a longer one is cut): far below MAX_REPLY_BYTES
# even at 4 bytes a character.
MAX_ERROR_CHARS = 64 * 1024

# code -> the class the client raises. Order matters for ``code_for``: the first class an
# exception is an instance of names its code (subclasses before their parents).
ERROR_CODES: dict[str, type[PixpoolError]] = {
    "order": ProtocolError,  # a release or start out of order (``code_for`` never picks it)
    "protocol": ProtocolError,
    "config": ConfigError,
    "capacity": CapacityError,
    "dataset": DatasetError,
    "snapshot": SnapshotError,
    "render": RenderError,
    "unknown_trainer": DaemonStopped,  # the daemon does not know this trainer (any more)
    "not_authorized": NotAuthorized,  # the client's CURVE key is not (or no longer) in authorized/
    "internal": PixpoolError,
}
_CODE_OF_CLASS = [(cls, code) for code, cls in ERROR_CODES.items() if code not in ("order", "unknown_trainer")]


def code_for(exc: BaseException) -> str:
    """The declared code of an error the daemon raised; ``internal`` for anything else."""
    for cls, code in _CODE_OF_CLASS:
        if isinstance(exc, cls):
            return code
    return "internal"


def error_from(msg: dict[str, Any]) -> PixpoolError:
    """The exception an ``error`` reply stands for: its code's class with the daemon's message.

    A code this side does not know (a newer daemon) falls back to ``PixpoolError``."""
    cls = ERROR_CODES.get(msg.get("code"), PixpoolError)
    message = str(msg.get("message", ""))
    if cls is ConfigError:
        return ConfigError(message, field=msg.get("field"))
    if cls is ProtocolError:
        return ProtocolError(message, field=msg.get("field"))
    return cls(message)


def error_frame(code: str, message: str, *, trainer_id: int | None = None, field: str | None = None) -> bytes:
    """One ``error`` reply. A message (or field) over ``MAX_ERROR_CHARS`` is cut there, saying so:
    an error reply is sent from the daemon's error path, which must never fail on its size."""
    if code not in ERROR_CODES:
        raise ValueError(f"undeclared error code {code!r}; declare it in ERROR_CODES")
    if len(message) > MAX_ERROR_CHARS:
        message = f"{message[:MAX_ERROR_CHARS]}... (cut at {MAX_ERROR_CHARS} of {len(message)} characters)"
    if field is not None:
        field = field[:MAX_ERROR_CHARS]
    return encode_reply(Op.ERROR, code=code, message=message, trainer_id=trainer_id, field=field)


def error_frame_for(exc: BaseException, *, trainer_id: int | None = None) -> bytes:
    """The ``error`` reply for an exception the daemon raised while handling a request."""
    return error_frame(code_for(exc), str(exc), trainer_id=trainer_id, field=getattr(exc, "field", None))


def as_error(msg: dict[str, Any]) -> str:
    """Human text of an ``error`` reply (for logs; callers raise ``error_from``)."""
    return f"{msg.get('code', 'error')}: {msg.get('message', '')}"
