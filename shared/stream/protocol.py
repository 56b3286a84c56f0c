"""The wire protocol between trainers and the daemon: msgpack maps with a version.

Runs in both processes: the daemon decodes what trainers send, the trainer decodes what
the daemon sends. Nothing is ever unpickled; a frame is a msgpack map with at least
``v`` (the protocol version) and ``op`` (the operation).

Every operation is declared once, here: ``Op`` names it (its members are the strings on the
wire, so ``msg["op"] == "ready"`` still holds), and the tables ``REQUESTS`` (trainer ->
daemon) and ``REPLIES`` (daemon -> trainer) give each its meaning and each field's type,
bounds and meaning. ``encode`` (a request) and ``encode_reply`` check what they send against
the table, so a missing, undeclared or wrong-typed field fails on the sending side;
``decode`` checks what arrives against the same table and raises ``ProtocolError`` saying
what is wrong (the daemon turns that into an ``error`` reply and keeps serving). The daemon
and the workers dispatch through tables keyed by ``Op`` / ``PipeOp``
(``server/daemon/service.py``, ``worker.py``, ``supervisor.py``).

The order of a session: ``attach`` -> ``attached``; ``prove`` -> ``proved`` (the trainer gets
batch frames until it proves it maps its ring); ``start`` -> ``started``, then one ``ready``
per batch, each answered by a ``release``; ``heartbeat`` all along; ``detach`` ->
``detached``. ``error`` and ``stopped`` may come at any time.

The daemon and its augmentation workers speak the same way over their pipes (``PipeOp``,
the table ``PIPE``; msgpack maps checked by ``pipe_frame`` and ``decode_pipe``; nothing
unpickled after start-up).

Every request is one frame of at most ``MAX_FRAME_BYTES``: a control message is a few hundred
bytes, so a larger one is refused before msgpack sees it, and a message of more frames is
dropped frame by frame without being kept. Replies may be up to ``MAX_REPLY_BYTES``, and
``encode_reply`` refuses a larger one (a trainer could not read it). What grows is bounded
where it is made: a ``status`` reply lists as many trainers as fit; the class names an
``attached`` and a ``records`` reply carry are at most ``MAX_NAMES_BYTES`` (the readers refuse
a dataset over it, and over ``--max-classes``); a ``records`` page at most ``RECORDS_PAGE_BYTES``
of file names.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Mapping

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
from .config import MAX_CLASSES, SPLITS, TASKS

__all__ = [
    "DELIVERIES",
    "DELIVERY_FRAMES",
    "DELIVERY_SHM",
    "ERROR_CODES",
    "MAX_CLASSES",
    "MAX_ERROR_CHARS",
    "MAX_FRAME_BYTES",
    "MAX_NAMES_BYTES",
    "MAX_REPLY_BYTES",
    "MAX_REQUEST_BYTES",
    "MAX_REQUEST_FRAMES",
    "MAX_WIRE_BYTES",
    "PIPE",
    "PROTOCOL_VERSION",
    "RECORDS_PAGE",
    "RECORDS_PAGE_BYTES",
    "REPLIES",
    "REQUESTS",
    "REQUEST_OPS",
    "Field",
    "Message",
    "Op",
    "PipeOp",
    "as_error",
    "code_for",
    "decode",
    "decode_pipe",
    "encode",
    "encode_reply",
    "error_frame",
    "error_frame_for",
    "error_from",
    "names_nbytes",
    "pipe_frame",
]

# 2: ready and release name the batch (epoch, batch, generation); 3: store and the locality proof;
# 4: the task (``attached`` names it; target rows of its width; segment batches carry mask planes).
PROTOCOL_VERSION = 4
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
# A ``records`` reply carries at most this many file names (it stays far below MAX_REPLY_BYTES).
RECORDS_PAGE = 2000
# ... or, asked ``packed``, the names as one byte string of at most this many bytes (NUL-terminated
# paths, ``shared/stream/path_table.py``): 100k names of 50 bytes come in 3 replies, not 50.
RECORDS_PAGE_BYTES = 1 << 20
# The class names, packed, that a dataset may have: an ``attached`` and every ``records`` reply
# carry them whole, so names + a records page + the rest stay far below MAX_REPLY_BYTES. An
# images folder's names "0".."N-1" fit it up to ``MAX_CLASSES`` (``config``: --max-classes' range).
MAX_NAMES_BYTES = 1 << 20
# Longest ``error`` message sent (characters; a longer one is cut): far below MAX_REPLY_BYTES
# even at 4 bytes a character.
MAX_ERROR_CHARS = 64 * 1024
_INT_LIMIT = 1 << 62
# Longest host name a trainer may report: DNS names are at most 253 characters.
MAX_HOST_CHARS = 255
# The PID namespace as ``readlink /proc/self/ns/pid`` gives it (``pid:[4026531836]``).
MAX_PID_NS_CHARS = 64
# The ring's locality nonce in hex (16 bytes: 32 characters; room for a longer one).
MAX_NONCE_CHARS = 128
# Keypoints a pose dataset's instance may have (COCO's people have 17; the bound keeps a
# target row, 6 + 3K floats, far below any slot).
MAX_KEYPOINTS = 1024


class Op(enum.StrEnum):
    """The operations between trainers and the daemon; each member is its string on the wire."""

    ATTACH = "attach"
    ATTACHED = "attached"
    PROVE = "prove"
    PROVED = "proved"
    START = "start"
    STARTED = "started"
    READY = "ready"
    RELEASE = "release"
    HEARTBEAT = "heartbeat"
    DETACH = "detach"
    DETACHED = "detached"
    STATUS = "status"
    HEALTH = "health"
    RECORDS = "records"
    ERROR = "error"
    STOPPED = "stopped"


class PipeOp(enum.StrEnum):
    """The operations on a daemon <-> worker pipe; each member is its string on the pipe."""

    JOB = "job"
    FORGET = "forget"
    STOP = "stop"
    HELLO = "hello"
    DONE = "done"
    FAILED = "failed"


@dataclass(frozen=True)
class Field:
    """What one message field means (``about``) and may hold: its types and, for what a client
    sends, its bounds (``lo``..``hi`` for numbers, ``max_len`` characters for strings,
    ``choices``), and whether it may be left out. Every check of a message's fields, on
    either side, is this table's."""

    types: tuple[type, ...]
    about: str = ""
    lo: float = -_INT_LIMIT
    hi: float = _INT_LIMIT
    max_len: int | None = None
    choices: tuple[str, ...] | None = None
    optional: bool = False


@dataclass(frozen=True)
class Message:
    """One operation in one direction: what it means and its fields (name -> ``Field``)."""

    about: str
    fields: Mapping[str, Field] = field(default_factory=dict)


_NONE = type(None)


def _int(about: str, **bounds: Any) -> Field:
    return Field((int,), about, **bounds)


def _id(about: str) -> Field:  # trainer ids and tokens: 0 .. 2**62
    return Field((int,), about, lo=0)


def _count(about: str) -> Field:  # epochs, batches, record positions
    return Field((int,), about, lo=0, hi=1 << 40)


def _str(about: str, **bounds: Any) -> Field:
    return Field((str,), about, **bounds)


def _map(about: str) -> Field:
    return Field((dict,), about)


def _list(about: str) -> Field:
    return Field((list,), about)


_TID = "the trainer's id, from ``attached``"
_TOKEN = "the session's secret, from ``attached``; a request without it is refused"
_EPOCH = "the epoch the batch belongs to"
_BATCH = "the batch's position in its epoch"
_GENERATION = "how many ``start``s the trainer had sent when the batch was announced"

# Trainer -> daemon. Requests carry their bounds: a trainer is not trusted.
REQUESTS: dict[Op, Message] = {
    Op.ATTACH: Message(
        "open a session with its own stream and ring; answered by ``attached``",
        {
            "settings": _map("the stream's ``StreamSettings.to_dict()``; the daemon validates it again"),
            "pid": _int("the trainer's process id (for people and logs)", lo=0, hi=1 << 32),
            "host": _str("the trainer's host name (for people and logs)", max_len=MAX_HOST_CHARS),
            "slots": _int("batch slots of the trainer's ring", lo=0, hi=1 << 16),
            "delivery": _str(
                "how the trainer asks to get batch bytes: in place from its ring (``shm``) or as frames",
                choices=DELIVERIES,
            ),
            "pid_ns": _str("the trainer's PID namespace", max_len=MAX_PID_NS_CHARS, optional=True),
        },
    ),
    Op.PROVE: Message(
        "prove the trainer maps its ring (host names and pids play no part, ``server/daemon/sessions.py``);"
        " answered by ``proved``",
        {
            "trainer_id": _id(_TID),
            "token": _id(_TOKEN),
            "nonce": _str(
                "the hex nonce read in the ring's header through the store path (empty if it could not map it)",
                max_len=MAX_NONCE_CHARS,
            ),
        },
    ),
    Op.START: Message(
        "produce ``epoch`` from ``batch`` on, abandoning what is not announced yet; answered by ``started``",
        {"trainer_id": _id(_TID), "token": _id(_TOKEN), "epoch": _count(_EPOCH), "batch": _count(_BATCH)},
    ),
    Op.RELEASE: Message(
        "the trainer is done with the batch announced so in ``slot``; a release naming anything but what the"
        " slot holds now (a duplicate, or one from before the slot was re-announced) gets an ``order`` error",
        {
            "trainer_id": _id(_TID),
            "token": _id(_TOKEN),
            "slot": _int("the ring slot the batch was announced in"),
            "epoch": _count(_EPOCH),
            "batch": _count(_BATCH),
            "generation": Field((int,), _GENERATION, lo=0),
        },
    ),
    Op.HEARTBEAT: Message(
        "the trainer is alive; answered by ``heartbeat``",
        {
            "trainer_id": _id(_TID),
            "token": _id(_TOKEN),
            "data_wait_s": Field(
                (float, int), "seconds this trainer spent waiting for batches so far", lo=0, hi=1e12, optional=True
            ),
        },
    ),
    Op.DETACH: Message(
        "end the session (the daemon unlinks its ring); answered by ``detached``",
        {"trainer_id": _id(_TID), "token": _id(_TOKEN)},
    ),
    Op.STATUS: Message("the daemon's whole state, for ``pixpool status`` and monitors; answered by ``status``"),
    Op.HEALTH: Message("a few dozen bytes for a liveness probe; answered by ``health``"),
    Op.RECORDS: Message(
        "a page of a split's image file names, so a trainer can name its samples; answered by ``records``",
        {
            "start": _count("the first record of the page"),
            "split": _str("the split (default ``train``)", choices=SPLITS, optional=True),
            "packed": Field(
                (bool,),
                f"send the names as one byte string (``packed``, at most {RECORDS_PAGE_BYTES} bytes) instead of a list",
                optional=True,
            ),
        },
    ),
}
REQUEST_OPS = frozenset(REQUESTS)

# Daemon -> trainer. Replies are checked for their types only: the daemon is trusted.
REPLIES: dict[Op, Message] = {
    Op.ATTACHED: Message(
        "the session is open; batches come as frames until ``prove`` grants ``shm``",
        {
            "trainer_id": _int(_TID),
            "token": _int("the session's secret, to send with every later request"),
            "ring": _str("the name of the trainer's ring in the store"),
            "layout": _map("the ring's ``RingLayout.to_dict()``"),
            "num_records": _int("records of the split this trainer streams"),
            "imgsz": _int("the training size: the snapshot's, which a trainer's ``augment.imgsz`` of None takes"),
            "daemon_pid": _int("the daemon's process id"),
            "host": _str("the daemon's host name"),
            "names": Field((list,), "the class names", optional=True),
            "task": _str(
                "what the served dataset's targets carry (``shared/stream/tasks.py``): it fixes the target row"
                " width (the layout's ``target_width``) and, for segment, the mask planes",
                choices=TASKS,
            ),
            "kpt_shape": Field(
                (_NONE, list),
                f"pose: the keypoints of an instance, [K, 2 or 3] with 1 <= K <= {MAX_KEYPOINTS}; nil otherwise",
            ),
            "flip_idx": Field(
                (_NONE, list),
                "pose: the keypoint each of the K becomes under a left-right flip (K integers 0..K-1); nil otherwise",
            ),
            "store": _str("the directory the ring is in"),
            "pid_ns": Field((str,), "the daemon's PID namespace", optional=True),
            "snapshot": Field(
                (dict,),
                "{fingerprint, name, records, served}: the snapshot this trainer's split streams, which a trainer"
                " attaching again after a restart compares with the one it began on; ``served``: which files the"
                " split is (``served_data.describe``), which a trainer that names its data compares",
                optional=True,
            ),
        },
    ),
    Op.PROVED: Message(
        "the outcome of ``prove``",
        {
            "trainer_id": _int(_TID),
            "delivery": _str("``shm`` where the nonce matches (and shm was asked for), else ``frames``"),
        },
    ),
    Op.STARTED: Message(
        "the daemon produces the epoch from the batch asked for",
        {
            "trainer_id": _int(_TID),
            "epoch": _int(_EPOCH),
            "batch": _int("the first batch that will be announced"),
            "num_batches": _int("batches in this epoch"),
        },
    ),
    Op.READY: Message(
        "a batch is in ``slot`` (as frames three more follow: images, targets, samples bytes; a fourth, the mask"
        " planes, where the layout has masks)",
        {
            "trainer_id": _int(_TID),
            "slot": _int("the ring slot the batch is in"),
            "epoch": _int(_EPOCH),
            "batch": _int(_BATCH),
            "generation": _int(_GENERATION),
            "size": _int("the batch's sample count"),
            "n_targets": _int("the batch's target rows"),
        },
    ),
    Op.HEARTBEAT: Message("the daemon's loop runs and knows this trainer", {"trainer_id": _int(_TID)}),
    Op.DETACHED: Message("the session is over", {"trainer_id": _int(_TID)}),
    Op.STATUS: Message(
        "the daemon's state (``ops/status_reply.py``)",
        {
            "daemon": _map("the daemon's settings and counters"),
            "snapshot": _map("the training split's snapshot"),
            "splits": Field((dict,), "split -> its snapshot", optional=True),
            "workers": _list("one map per augmentation worker"),
            "trainers": _list("one map per attached trainer (as many as fit the reply)"),
        },
    ),
    Op.HEALTH: Message(
        "whether the daemon serves",
        {
            "pid": _int("the daemon's process id"),
            "healthy": Field((bool,), "every worker slot has a live worker and none failed to start"),
            "trainers": _int("attached trainers"),
            "workers_ready": _int("workers ready for jobs"),
            "uptime_s": Field((float, int), "seconds since the daemon started"),
        },
    ),
    Op.RECORDS: Message(
        "a page of image file names",
        {
            "start": _int("the first record of the page"),
            "total": _int("the split's record count"),
            "files": _list(f"the image file names of records ``start`` .. (at most {RECORDS_PAGE}); empty when packed"),
            "names": _list("the class names"),
            "packed": Field(
                (bytes,),
                "asked ``packed``: the names of records ``start`` .. as NUL-terminated UTF-8 (surrogateescape) paths",
                optional=True,
            ),
            "count": _int("asked ``packed``: how many names ``packed`` holds", optional=True),
        },
    ),
    Op.ERROR: Message(
        "a request failed, or the daemon tells a trainer why it ends its session; the client raises"
        " ``error_from`` (the class of ``code`` with the daemon's message), so ``except CapacityError`` works"
        " across the wire",
        {
            "code": _str("one of ``ERROR_CODES``, each the name of a class of the error tree"),
            "message": _str("what happened and what to change"),
            "trainer_id": Field((int, _NONE), "the trainer it concerns (nil: the request's sender)", optional=True),
            "field": Field((str, _NONE), "the refused setting or message field (may be nil)", optional=True),
        },
    ),
    Op.STOPPED: Message("the daemon is shutting down", {"reason": _str("why")}),
}

# Daemon <-> worker pipes (no version: both ends are the same installation).
PIPE: dict[PipeOp, Message] = {
    PipeOp.JOB: Message(
        "daemon -> worker: render sample positions ``start .. stop`` of a batch of ``size`` samples of that"
        " split's source into those positions of ``slot``",
        {
            "job": _int("the job's id, echoed in ``done``/``failed``"),
            "ring": _str("the trainer's ring"),
            "split": _str("the split whose source is rendered"),
            "slot": _int("the ring slot"),
            "settings": _map("the stream's ``StreamSettings.to_dict()``"),
            "epoch": _int(_EPOCH),
            "batch": _int(_BATCH),
            "size": _int("the batch's sample count"),
            "start": _int("the first sample position of the part"),
            "stop": _int("one past the last sample position of the part"),
        },
    ),
    PipeOp.FORGET: Message("daemon -> worker: close that ring (its trainer left)", {"ring": _str("the ring")}),
    PipeOp.STOP: Message("daemon -> worker: exit"),
    PipeOp.HELLO: Message(
        "worker -> daemon, once ready", {"pid": _int("the worker's pid"), "index": _int("its worker slot")}
    ),
    PipeOp.DONE: Message(
        "worker -> daemon: a part is written",
        {
            "job": _int("the job's id"),
            "counts": _list("target rows of each sample of the part"),
            "seconds": Field((float, int), "how long the part took"),
        },
    ),
    PipeOp.FAILED: Message(
        "worker -> daemon: a part failed", {"job": _int("the job's id"), "error": _str("the exception, as text")}
    ),
}


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
    """One request frame (trainer -> daemon): ``{v, op, **fields}`` packed with msgpack (no
    extension types), after checking the fields against ``REQUESTS``: ProtocolError naming
    the op and field for one missing, undeclared, mistyped or out of bounds."""
    return _pack(_checked(op, fields, REQUESTS, "request"), fields)


def encode_reply(op: str, **fields: Any) -> bytes:
    """One reply frame (daemon -> trainer), checked against ``REPLIES`` as ``encode`` does, and
    against ``MAX_REPLY_BYTES``: a larger frame is a ProtocolError here, on the daemon's side,
    because the trainer would refuse it (``decode``) and never learn why."""
    key = _checked(op, fields, REPLIES, "reply")
    frame = _pack(key, fields)
    if len(frame) > MAX_REPLY_BYTES:
        raise ProtocolError(
            f"reply {key.value!r} of {len(frame)} bytes exceeds the limit of {MAX_REPLY_BYTES} bytes a trainer reads; "
            "what grows with the dataset or the sessions must be bounded or paged where the reply is built"
        )
    return frame


def names_nbytes(names) -> int:
    """Bytes the class ``names`` take in a reply (packed as a msgpack list), for ``MAX_NAMES_BYTES``."""
    return len(msgpack.packb(list(names), use_bin_type=True))


def _pack(op: Op, fields: dict[str, Any]) -> bytes:
    return msgpack.packb({"v": PROTOCOL_VERSION, "op": op.value, **fields}, use_bin_type=True)


def _checked(op: str, fields: dict[str, Any], table: Mapping[Any, Message], kind: str) -> Any:
    """The declared op of ``op`` after checking ``fields`` (the sending side's checks)."""
    key = next((k for k in table if k == op), None)  # the member: a str equal to it finds it too
    if key is None:
        raise ProtocolError(f"cannot send {kind} op {str(op)!r}: it is not declared; declared: {_names(table)}")
    schema = table[key].fields
    for name in fields:
        if name not in schema:
            raise ProtocolError(
                f"cannot send op {key.value!r} with field {name!r}: the op declares {sorted(schema)}; "
                "declare the field in shared/stream/protocol.py",
                field=name,
            )
    _check_fields(key.value, fields, schema)
    _check_shape_of(key.value, fields)
    return key


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


def decode(frame: bytes | memoryview, *, reply: bool = False) -> dict[str, Any]:
    """Parse and validate one frame; ``reply`` selects the daemon->trainer table.

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
            f"protocol version mismatch: peer speaks version {version!r}, this side speaks version {PROTOCOL_VERSION}; "
            "run the same pixpool release on both sides"
        )
    op = msg.get("op")
    if not isinstance(op, str) or op not in _ALL_OPS:
        raise ProtocolError(f"unknown op {op!r}; expected one of {sorted(_ALL_OPS)}")
    table = REPLIES if reply else REQUESTS
    if op not in table:
        if not reply:
            raise ProtocolError(f"op {op!r} is not a request a trainer may send; expected one of {_names(REQUEST_OPS)}")
        raise ProtocolError(f"op {op!r} is not a reply a daemon sends; expected one of {_names(REPLIES)}")
    _check_fields(op, msg, table[op].fields)
    _check_shape_of(op, msg)
    return msg


_ALL_OPS = frozenset(op.value for op in Op)


def _names(ops) -> list[str]:
    return sorted(str(op) for op in ops)


def _check_fields(op: str, msg: Mapping[str, Any], schema: Mapping[str, Field]) -> None:
    for name, spec in schema.items():
        if name not in msg:
            if spec.optional:
                continue
            raise ProtocolError(f"op {op!r} lacks field {name!r}", field=name)
        _check_value(op, name, msg[name], spec)


def _check_value(op: str, name: str, value: Any, spec: Field) -> None:
    kind = " or ".join("nil" if t is _NONE else t.__name__ for t in spec.types)
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


def _check_shape_of(op: str, msg: Mapping[str, Any]) -> None:
    """The checks one field's type cannot say: an ``attached`` reply's keypoint shape and flip map."""
    if op != Op.ATTACHED:
        return
    kpt_shape, flip_idx = msg.get("kpt_shape"), msg.get("flip_idx")
    if kpt_shape is not None:
        ints = all(isinstance(v, int) and not isinstance(v, bool) for v in kpt_shape)
        if not (ints and len(kpt_shape) == 2 and 1 <= kpt_shape[0] <= MAX_KEYPOINTS and kpt_shape[1] in (2, 3)):
            raise ProtocolError(
                f"op 'attached': field 'kpt_shape' = {kpt_shape!r:.80} must be [K, 2 or 3] "
                f"with 1 <= K <= {MAX_KEYPOINTS}",
                field="kpt_shape",
            )
    if msg.get("task") == "pose" and kpt_shape is None:
        raise ProtocolError("op 'attached': a pose task needs field 'kpt_shape' ([K, 2 or 3])", field="kpt_shape")
    if flip_idx is not None:
        k = kpt_shape[0] if kpt_shape is not None else None
        if (
            k is None
            or len(flip_idx) != k
            or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < k for i in flip_idx)
        ):
            raise ProtocolError(
                f"op 'attached': field 'flip_idx' = {flip_idx!r:.120} must be K = {k} integers from 0 to K-1 "
                "(the keypoint each one becomes under a left-right flip), with 'kpt_shape' given",
                field="flip_idx",
            )


def as_error(msg: dict[str, Any]) -> str:
    """Human text of an ``error`` reply (for logs; callers raise ``error_from``)."""
    return f"{msg.get('code', 'error')}: {msg.get('message', '')}"


# -- the daemon <-> worker pipes ------------------------------------------------------------
def pipe_frame(op: str, **fields: Any) -> bytes:
    """One pipe message (no version: both ends are the same installation), checked against ``PIPE``."""
    key = _checked(op, fields, PIPE, "pipe")
    return msgpack.packb({"op": key.value, **fields}, use_bin_type=True)


def decode_pipe(frame: bytes) -> dict[str, Any]:
    """Parse and validate one pipe message; ProtocolError names what is wrong."""
    try:
        msg = msgpack.unpackb(frame, raw=False, strict_map_key=True)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise ProtocolError(f"pipe message of {len(frame)} bytes is not valid msgpack ({exc})") from None
    op = msg.get("op") if isinstance(msg, dict) else None
    if not isinstance(op, str) or op not in PIPE:
        raise ProtocolError(f"unknown pipe op {op!r}; expected one of {_names(PIPE)}")
    _check_fields(op, msg, PIPE[op].fields)
    if op == PipeOp.DONE and not all(
        isinstance(c, int) and not isinstance(c, bool) and 0 <= c < _INT_LIMIT for c in msg["counts"]
    ):
        raise ProtocolError(
            f"op 'done': field 'counts' must be a list of target-row counts (integers >= 0), got {msg['counts']!r:.200}"
        )
    return msg
