"""The wire protocol between trainers and the daemon: msgpack maps with a version.

Runs in both processes: the daemon decodes what trainers send, the trainer decodes what
the daemon sends. Nothing is ever unpickled; a frame is a msgpack map with at least
``v`` (the protocol version) and ``op`` (the operation). ``decode`` validates the map
against the table below and raises ``ProtocolError`` with a message that says what is
wrong; the daemon turns that into an ``error`` reply and keeps serving.

Operations (-> daemon, <- trainer):

- ``attach`` -> {settings, pid, host, slots, delivery, pid_ns (optional)}; reply ``attached``
  <- {trainer_id, token, ring, layout, num_records, imgsz (the training size: the trainer's
  ``augment.imgsz``, which None takes from here), daemon_pid, host, names (class names),
  store (the directory the ring is in), pid_ns (the daemon's PID namespace), snapshot
  (optional: {fingerprint, name, records}, the snapshot this trainer's split streams, which a
  trainer attaching again after a restart compares with the one it began on)}. ``delivery``
  is what the trainer asks for; it gets frames until it proves it maps its ring:
- ``prove`` -> {trainer_id, token, nonce}: the hex nonce the trainer read in its ring's
  header through the store path (empty if it could not map the ring); reply ``proved``
  <- {trainer_id, delivery}: ``shm`` where the nonce matches (and shm was asked for),
  else ``frames``. Host names and pids play no part (``server/daemon/sessions.py``).
- ``start`` -> {trainer_id, token, epoch, batch}: produce ``epoch`` from ``batch`` on;
  reply ``started`` <- {epoch, batch, num_batches}.
- ``ready`` <- {trainer_id, slot, epoch, batch, generation, size, n_targets}: a batch is in
  ``slot`` (over TCP three more frames follow: images, targets, samples bytes);
  ``generation`` counts the trainer's ``start``s.
- ``release`` -> {trainer_id, token, slot, epoch, batch, generation}: the trainer is done
  with the batch announced so; a release naming anything but what the slot holds now
  (a duplicate, or one from before the slot was re-announced) gets an ``order`` error.
- ``heartbeat`` -> {trainer_id, token, data_wait_s (optional: seconds this trainer spent
  waiting for batches so far)}; reply ``heartbeat`` <- {trainer_id}.
- ``detach`` -> {trainer_id, token}; reply ``detached`` <- {trainer_id}.
- ``status`` -> {}; reply ``status`` <- {daemon, snapshot, workers, trainers}.
- ``records`` -> {start, split (optional, default "train")}; reply ``records`` <- {start,
  total, files, names}: the image file names of that split's records ``start`` ..
  ``start + len(files)`` (at most ``RECORDS_PAGE``), its record count and the class names,
  so a trainer can name its samples.
- ``error`` <- {code, message, trainer_id (may be nil), field (may be nil)}: ``code`` is one
  of ``ERROR_CODES``, each the name of a class of the error tree; the client raises that
  class with the daemon's message (``error_from``), so ``except CapacityError`` works
  across the wire.
- ``stopped`` <- {reason}: the daemon is shutting down.

The daemon and its augmentation workers speak the same way over their pipes (msgpack
maps, validated by ``decode_pipe``; nothing unpickled after start-up):

- daemon -> worker: ``job`` {job, ring, split, slot, settings, epoch, batch, size, start,
  stop}: render sample positions ``start .. stop`` of that batch (of ``size`` samples) of
  that split's source into those positions of that slot; ``forget`` {ring}: close that ring (its trainer left); ``stop``.
- worker -> daemon: ``hello`` {pid, index} once ready; ``done`` {job, counts (target rows
  of each sample of the part), seconds}; ``failed`` {job, error}.

Every request is one frame of at most ``MAX_FRAME_BYTES``: a control message is a few hundred
bytes, so a larger one is refused before msgpack sees it, and a message of more frames is
dropped frame by frame without being kept. Replies may be up to ``MAX_REPLY_BYTES``: a
``status`` reply grows with the number of attached trainers (each carries its settings).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

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
from .config import SPLITS

PROTOCOL_VERSION = 3  # 2: ready and release name the batch (epoch, batch, generation); 3: store and the locality proof
# How a trainer receives batch bytes (``attach``'s ``delivery``): in place from its ring's
# slots (same machine), or as zero-copy frames after ``ready`` (TCP).
DELIVERY_SHM = "shm"
DELIVERY_FRAMES = "frames"
DELIVERIES = (DELIVERY_SHM, DELIVERY_FRAMES)
MAX_FRAME_BYTES = 64 * 1024
# Requests between MAX_FRAME_BYTES and this get an error reply; larger ones make libzmq
# drop the peer before allocating the frame (the daemon's sockets set ZMQ_MAXMSGSIZE).
# Twice the request limit: libzmq holds every frame of a multipart message until its last
# one arrived, so this bounds what each frame of such a message can cost the daemon.
MAX_WIRE_BYTES = 2 * MAX_FRAME_BYTES
# A request is one frame after the peer's routing id; a message with more frames, or more
# bytes in all, is read frame by frame and dropped without keeping any (``server/daemon/intake.py``).
MAX_REQUEST_FRAMES = 1
MAX_REQUEST_BYTES = MAX_FRAME_BYTES
MAX_REPLY_BYTES = 4 * 1024 * 1024
_INT_LIMIT = 1 << 62


@dataclass(frozen=True)
class Field:
    """What one message field may hold: its types and, for what a client sends, its bounds
    (``lo``..``hi`` for numbers, ``max_len`` characters for strings, ``choices``), and
    whether it may be left out. Every check of a request's fields is this table's."""

    types: tuple[type, ...]
    lo: float = -_INT_LIMIT
    hi: float = _INT_LIMIT
    max_len: int | None = None
    choices: tuple[str, ...] | None = None
    optional: bool = False


_INT = Field((int,))
_STR = Field((str,))
_MAP = Field((dict,))
_LIST = Field((list,))
_ID = Field((int,), lo=0)  # trainer ids and tokens: 0 .. 2**62
_COUNT = Field((int,), lo=0, hi=1 << 40)  # epochs, batches, record positions
# Longest host name a trainer may report: DNS names are at most 253 characters.
MAX_HOST_CHARS = 255
# The PID namespace as ``readlink /proc/self/ns/pid`` gives it (``pid:[4026531836]``).
MAX_PID_NS_CHARS = 64
# The ring's locality nonce in hex (16 bytes: 32 characters; room for a longer one).
MAX_NONCE_CHARS = 128

# op -> {field: Field}; requests carry their bounds, replies only their types.
_SCHEMA: dict[str, dict[str, Field]] = {
    "attach": {
        "settings": _MAP,
        "pid": Field((int,), lo=0, hi=1 << 32),
        "host": Field((str,), max_len=MAX_HOST_CHARS),
        "slots": Field((int,), lo=0, hi=1 << 16),
        "delivery": Field((str,), choices=DELIVERIES),
        "pid_ns": Field((str,), max_len=MAX_PID_NS_CHARS, optional=True),
    },
    "attached": {
        "trainer_id": _INT,
        "token": _INT,
        "ring": _STR,
        "layout": _MAP,
        "num_records": _INT,
        "imgsz": _INT,
        "daemon_pid": _INT,
        "host": _STR,
        "store": _STR,
    },
    "prove": {"trainer_id": _ID, "token": _ID, "nonce": Field((str,), max_len=MAX_NONCE_CHARS)},
    "proved": {"trainer_id": _INT, "delivery": _STR},
    "start": {"trainer_id": _ID, "token": _ID, "epoch": _COUNT, "batch": _COUNT},
    "started": {"trainer_id": _INT, "epoch": _INT, "batch": _INT, "num_batches": _INT},
    "ready": {
        "trainer_id": _INT,
        "slot": _INT,
        "epoch": _INT,
        "batch": _INT,
        "generation": _INT,
        "size": _INT,
        "n_targets": _INT,
    },
    "release": {
        "trainer_id": _ID,
        "token": _ID,
        "slot": _INT,
        "epoch": _COUNT,
        "batch": _COUNT,
        "generation": Field((int,), lo=0),
    },
    "heartbeat": {"trainer_id": _ID, "token": _ID, "data_wait_s": Field((float, int), lo=0, hi=1e12, optional=True)},
    "detach": {"trainer_id": _ID, "token": _ID},
    "detached": {"trainer_id": _INT},
    "status": {},
    "health": {},
    "records": {"start": _COUNT, "split": Field((str,), choices=SPLITS, optional=True)},
    "error": {"code": _STR, "message": _STR},
    "stopped": {"reason": _STR},
}
# Replies that reuse a request's op name carry different fields.
_REPLY_SCHEMA: dict[str, dict[str, Field]] = {
    "heartbeat": {"trainer_id": _INT},
    "status": {"daemon": _MAP, "snapshot": _MAP, "workers": _LIST, "trainers": _LIST},
    "health": {
        "pid": _INT,
        "healthy": Field((bool,)),
        "trainers": _INT,
        "workers_ready": _INT,
        "uptime_s": Field((float, int)),
    },
    "records": {"start": _INT, "total": _INT, "files": _LIST, "names": _LIST},
}
REQUEST_OPS = frozenset({"attach", "start", "release", "heartbeat", "detach", "status", "health", "records", "prove"})
# A ``records`` reply carries at most this many file names (it stays far below MAX_REPLY_BYTES).
RECORDS_PAGE = 2000


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


def encode(op: str, **fields: Any) -> bytes:
    """One frame: ``{v, op, **fields}`` packed with msgpack (no extension types)."""
    return msgpack.packb({"v": PROTOCOL_VERSION, "op": op, **fields}, use_bin_type=True)


def error_frame(code: str, message: str, *, trainer_id: int | None = None, field: str | None = None) -> bytes:
    if code not in ERROR_CODES:
        raise ValueError(f"undeclared error code {code!r}; declare it in ERROR_CODES")
    return encode("error", code=code, message=message, trainer_id=trainer_id, field=field)


def error_frame_for(exc: BaseException, *, trainer_id: int | None = None) -> bytes:
    """The ``error`` reply for an exception the daemon raised while handling a request."""
    return error_frame(code_for(exc), str(exc), trainer_id=trainer_id, field=getattr(exc, "field", None))


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
        raise ProtocolError(
            f"frame of {size} bytes is not one valid msgpack message ({type(exc).__name__}: {exc})"
        ) from None
    if not isinstance(msg, dict):
        raise ProtocolError(f"a message must be a msgpack map, got {type(msg).__name__}")
    version = msg.get("v")
    if version != PROTOCOL_VERSION or isinstance(version, bool):
        raise ProtocolError(
            f"protocol version mismatch: peer speaks version {version!r}, this side speaks version {PROTOCOL_VERSION}; run the same pixpool release on both sides"
        )
    op = msg.get("op")
    if not isinstance(op, str) or op not in _SCHEMA:
        raise ProtocolError(f"unknown op {op!r}; expected one of {sorted(_SCHEMA)}")
    if not reply and op not in REQUEST_OPS:
        raise ProtocolError(f"op {op!r} is not a request a trainer may send; expected one of {sorted(REQUEST_OPS)}")
    _check_fields(op, msg, _REPLY_SCHEMA.get(op, _SCHEMA[op]) if reply else _SCHEMA[op])
    return msg


def _check_fields(op: str, msg: dict[str, Any], schema: dict[str, Field]) -> None:
    for name, spec in schema.items():
        if name not in msg:
            if spec.optional:
                continue
            raise ProtocolError(f"op {op!r} lacks field {name!r}", field=name)
        _check_value(op, name, msg[name], spec)


def _check_value(op: str, name: str, value: Any, spec: Field) -> None:
    kind = spec.types[0].__name__
    if isinstance(value, bool) and bool not in spec.types:
        raise ProtocolError(f"op {op!r}: field {name!r} must be {kind}, got bool", field=name)
    if not isinstance(value, spec.types):
        raise ProtocolError(f"op {op!r}: field {name!r} must be {kind}, got {type(value).__name__}", field=name)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not spec.lo <= value < spec.hi:
        raise ProtocolError(
            f"op {op!r}: field {name!r} = {value!r:.40} is out of range; use {spec.lo:g} <= {name} < {spec.hi:g}",
            field=name,
        )
    if isinstance(value, str):
        if spec.max_len is not None and len(value) > spec.max_len:
            raise ProtocolError(
                f"op {op!r}: field {name!r} is {len(value)} characters long, "
                f"over the limit of {spec.max_len}; "
                "send a shorter value",
                field=name,
            )
        if spec.choices is not None and value not in spec.choices:
            raise ProtocolError(
                f"op {op!r}: field {name!r} = {value!r:.40} is not one of {list(spec.choices)}", field=name
            )


def as_error(msg: dict[str, Any]) -> str:
    """Human text of an ``error`` reply (for logs; callers raise ``error_from``)."""
    return f"{msg.get('code', 'error')}: {msg.get('message', '')}"


# -- the daemon <-> worker pipes ------------------------------------------------------------
_PIPE_SCHEMA: dict[str, dict[str, Field]] = {
    "job": {
        "job": _INT,
        "ring": _STR,
        "split": _STR,
        "slot": _INT,
        "settings": _MAP,
        "epoch": _INT,
        "batch": _INT,
        "size": _INT,
        "start": _INT,
        "stop": _INT,
    },
    "forget": {"ring": _STR},
    "stop": {},
    "hello": {"pid": _INT, "index": _INT},
    "done": {"job": _INT, "counts": _LIST, "seconds": Field((float, int))},
    "failed": {"job": _INT, "error": _STR},
}


def pipe_frame(op: str, **fields: Any) -> bytes:
    """One pipe message (no version: both ends are the same installation)."""
    return msgpack.packb({"op": op, **fields}, use_bin_type=True)


def decode_pipe(frame: bytes) -> dict[str, Any]:
    """Parse and validate one pipe message; ProtocolError names what is wrong."""
    try:
        msg = msgpack.unpackb(frame, raw=False, strict_map_key=True)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise ProtocolError(f"pipe message of {len(frame)} bytes is not valid msgpack ({exc})") from None
    op = msg.get("op") if isinstance(msg, dict) else None
    if op not in _PIPE_SCHEMA:
        raise ProtocolError(f"unknown pipe op {op!r}; expected one of {sorted(_PIPE_SCHEMA)}")
    _check_fields(op, msg, _PIPE_SCHEMA[op])
    if op == "done" and not all(
        isinstance(c, int) and not isinstance(c, bool) and 0 <= c < _INT_LIMIT for c in msg["counts"]
    ):
        raise ProtocolError(
            f"op 'done': field 'counts' must be a list of target-row counts (integers >= 0), got {msg['counts']!r:.200}"
        )
    return msg
