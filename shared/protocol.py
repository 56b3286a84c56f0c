"""The wire protocol between trainers and the daemon: msgpack maps with a version.

Runs in both processes: the daemon decodes what trainers send, the trainer decodes what
the daemon sends. Nothing is ever unpickled; a frame is a msgpack map with at least
``v`` (the protocol version) and ``op`` (the operation). ``decode`` validates the map
against the table below and raises ``ProtocolError`` with a message that says what is
wrong; the daemon turns that into an ``error`` reply and keeps serving.

Operations (-> daemon, <- trainer):

- ``attach`` -> {settings, pid, host, slots, delivery}; reply ``attached``
  <- {trainer_id, token, ring, layout, num_records, daemon_pid, host}.
- ``start`` -> {trainer_id, token, epoch, batch}: produce ``epoch`` from ``batch`` on;
  reply ``started`` <- {epoch, batch, num_batches}.
- ``ready`` <- {trainer_id, slot, epoch, batch, size, n_targets}: a batch is in ``slot``
  (over TCP three more frames follow: images, targets, samples bytes).
- ``release`` -> {trainer_id, token, slot}: the trainer is done with ``slot``.
- ``heartbeat`` -> {trainer_id, token}; reply ``heartbeat`` <- {trainer_id}.
- ``detach`` -> {trainer_id, token}; reply ``detached`` <- {trainer_id}.
- ``status`` -> {}; reply ``status`` <- {daemon, snapshot, workers, trainers}.
- ``error`` <- {code, message, trainer_id (may be nil)}.
- ``stopped`` <- {reason}: the daemon is shutting down.

Every request is at most ``MAX_FRAME_BYTES``: a control message is a few hundred bytes, so a
larger one is refused before msgpack sees it. Replies may be up to ``MAX_REPLY_BYTES``: a
``status`` reply grows with the number of attached trainers (each carries its settings).
"""

from __future__ import annotations

from typing import Any

import msgpack

from .errors import ProtocolError

PROTOCOL_VERSION = 1
MAX_FRAME_BYTES = 64 * 1024
# Requests between MAX_FRAME_BYTES and this get an error reply; larger ones make libzmq
# drop the peer before allocating the frame (the daemon's sockets set ZMQ_MAXMSGSIZE).
MAX_WIRE_BYTES = 1024 * 1024
MAX_REPLY_BYTES = 4 * 1024 * 1024

_INT = (int,)
_STR = (str,)
_MAP = (dict,)

# op -> {field: allowed types}; every listed field is required.
_SCHEMA: dict[str, dict[str, tuple[type, ...]]] = {
    "attach": {"settings": _MAP, "pid": _INT, "host": _STR, "slots": _INT, "delivery": _STR},
    "attached": {
        "trainer_id": _INT,
        "token": _INT,
        "ring": _STR,
        "layout": _MAP,
        "num_records": _INT,
        "daemon_pid": _INT,
        "host": _STR,
    },
    "start": {"trainer_id": _INT, "token": _INT, "epoch": _INT, "batch": _INT},
    "started": {"trainer_id": _INT, "epoch": _INT, "batch": _INT, "num_batches": _INT},
    "ready": {"trainer_id": _INT, "slot": _INT, "epoch": _INT, "batch": _INT, "size": _INT, "n_targets": _INT},
    "release": {"trainer_id": _INT, "token": _INT, "slot": _INT},
    "heartbeat": {"trainer_id": _INT, "token": _INT},
    "detach": {"trainer_id": _INT, "token": _INT},
    "detached": {"trainer_id": _INT},
    "status": {},
    "error": {"code": _STR, "message": _STR},
    "stopped": {"reason": _STR},
}
# Replies that reuse a request's op name carry different fields.
_REPLY_SCHEMA: dict[str, dict[str, tuple[type, ...]]] = {
    "heartbeat": {"trainer_id": _INT},
    "status": {"daemon": _MAP, "snapshot": _MAP, "workers": (list,), "trainers": (list,)},
}
REQUEST_OPS = frozenset({"attach", "start", "release", "heartbeat", "detach", "status"})
_INT_LIMIT = 1 << 62


def encode(op: str, **fields: Any) -> bytes:
    """One frame: ``{v, op, **fields}`` packed with msgpack (no extension types)."""
    return msgpack.packb({"v": PROTOCOL_VERSION, "op": op, **fields}, use_bin_type=True)


def error_frame(code: str, message: str, *, trainer_id: int | None = None) -> bytes:
    return encode("error", code=code, message=message, trainer_id=trainer_id)


def decode(frame: bytes | memoryview, *, reply: bool = False) -> dict[str, Any]:
    """Parse and validate one frame; ``reply`` selects the daemon->trainer schema.

    Raises ``ProtocolError`` naming the problem (size, encoding, version, op, field).
    """
    size = len(frame)
    limit = MAX_REPLY_BYTES if reply else MAX_FRAME_BYTES
    if size > limit:
        raise ProtocolError(f"frame of {size} bytes exceeds the limit of {limit} bytes for a control message")
    try:
        # raw=False: strings must be valid UTF-8; strict_map_key: keys must be str/bytes.
        # No ext_hook: extension types come back as ExtType and fail the type checks below.
        msg = msgpack.unpackb(bytes(frame), raw=False, strict_map_key=True)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, RecursionError) as exc:
        raise ProtocolError(f"frame of {size} bytes is not one valid msgpack message ({type(exc).__name__}: {exc})") from None
    if not isinstance(msg, dict):
        raise ProtocolError(f"a message must be a msgpack map, got {type(msg).__name__}")
    version = msg.get("v")
    if version != PROTOCOL_VERSION or isinstance(version, bool):
        raise ProtocolError(f"protocol version mismatch: peer speaks version {version!r}, this side speaks version {PROTOCOL_VERSION}; run the same pixpool release on both sides")
    op = msg.get("op")
    if not isinstance(op, str) or op not in _SCHEMA:
        raise ProtocolError(f"unknown op {op!r}; expected one of {sorted(_SCHEMA)}")
    if not reply and op not in REQUEST_OPS:
        raise ProtocolError(f"op {op!r} is not a request a trainer may send; expected one of {sorted(REQUEST_OPS)}")
    schema = _REPLY_SCHEMA.get(op, _SCHEMA[op]) if reply else _SCHEMA[op]
    for name, types in schema.items():
        if name not in msg:
            raise ProtocolError(f"op {op!r} lacks field {name!r}")
        value = msg[name]
        if isinstance(value, bool) and bool not in types:
            raise ProtocolError(f"op {op!r}: field {name!r} must be {types[0].__name__}, got bool")
        if not isinstance(value, types):
            raise ProtocolError(f"op {op!r}: field {name!r} must be {types[0].__name__}, got {type(value).__name__}")
        if isinstance(value, int) and not isinstance(value, bool) and not -_INT_LIMIT < value < _INT_LIMIT:
            raise ProtocolError(f"op {op!r}: field {name!r} = {value} is out of range")
    return msg


def as_error(msg: dict[str, Any]) -> str:
    """Human text of an ``error`` reply."""
    return f"{msg.get('code', 'error')}: {msg.get('message', '')}"
