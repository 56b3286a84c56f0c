"""The trainer protocol: the messages between trainers and the daemon, msgpack maps with a version.

Runs in both processes: the daemon decodes what trainers send, the trainer decodes what
the daemon sends. Nothing is ever unpickled; a frame is a msgpack map with at least
``v`` (the protocol version) and ``op`` (the operation).

Every operation is declared once, here: ``Op`` names it (its members are the strings on the
wire, so ``msg["op"] == "ready"`` still holds), and the tables ``REQUESTS`` (trainer ->
daemon) and ``REPLIES`` (daemon -> trainer) give each its meaning and each field's type,
bounds and meaning (``shared.schema`` declarations). ``encode`` (a request) and ``encode_reply``
check what they send against the table, so a missing, undeclared or wrong-typed field fails on
the sending side; ``decode`` checks what arrives against the same table and raises
``ProtocolError`` saying what is wrong (the daemon turns that into an ``error`` reply,
``error_codes``, and keeps serving). The daemon dispatches through tables keyed by ``Op``
(``server/daemon/service.py``); its workers speak over pipes (``worker_pipe``).

The order of a session: ``attach`` -> ``attached``; ``prove`` -> ``proved`` (the trainer gets
batch frames until it proves it maps its ring); ``start`` -> ``started``, then one ``ready``
per batch, each answered by a ``release``; ``heartbeat`` all along; ``detach`` ->
``detached``. ``error`` and ``stopped`` may come at any time.

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
from typing import Any

import msgpack

from ..errors import ProtocolError
from ..schema import NONE, Message
from ..stream.config import SPLITS
from ..task import TASKS, TaskSpec, task_spec
from ._fields import (
    check_fields,
    check_outgoing,
    count_field,
    id_field,
    int_field,
    list_field,
    map_field,
    op_names,
    str_field,
    wire_field,
)

__all__ = [
    "attached_task",
    "DELIVERIES",
    "DELIVERY_FRAMES",
    "DELIVERY_SHM",
    "MAX_FRAME_BYTES",
    "MAX_HOST_CHARS",
    "MAX_KEYPOINTS",
    "MAX_NAMES_BYTES",
    "MAX_NONCE_CHARS",
    "MAX_PID_NS_CHARS",
    "MAX_REPLY_BYTES",
    "MAX_REQUEST_BYTES",
    "MAX_REQUEST_FRAMES",
    "MAX_WIRE_BYTES",
    "PROTOCOL_VERSION",
    "RECORDS_PAGE",
    "RECORDS_PAGE_BYTES",
    "REPLIES",
    "REQUESTS",
    "REQUEST_OPS",
    "Op",
    "decode",
    "encode",
    "encode_reply",
    "names_nbytes",
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
            "settings": map_field("the stream's ``StreamSettings.to_dict()``; the daemon validates it again"),
            "pid": int_field("the trainer's process id (for people and logs)", lo=0, hi=1 << 32),
            "host": str_field("the trainer's host name (for people and logs)", max_len=MAX_HOST_CHARS),
            "slots": int_field("batch slots of the trainer's ring", lo=0, hi=1 << 16),
            "delivery": str_field(
                "how the trainer asks to get batch bytes: in place from its ring (``shm``) or as frames",
                choices=DELIVERIES,
            ),
            "pid_ns": str_field("the trainer's PID namespace", max_len=MAX_PID_NS_CHARS, optional=True),
        },
    ),
    Op.PROVE: Message(
        "prove the trainer maps its ring (host names and pids play no part, ``server/daemon/sessions.py``);"
        " answered by ``proved``",
        {
            "trainer_id": id_field(_TID),
            "token": id_field(_TOKEN),
            "nonce": str_field(
                "the hex nonce read in the ring's header through the store path (empty if it could not map it)",
                max_len=MAX_NONCE_CHARS,
            ),
        },
    ),
    Op.START: Message(
        "produce ``epoch`` from ``batch`` on, abandoning what is not announced yet; answered by ``started``",
        {
            "trainer_id": id_field(_TID),
            "token": id_field(_TOKEN),
            "epoch": count_field(_EPOCH),
            "batch": count_field(_BATCH),
        },
    ),
    Op.RELEASE: Message(
        "the trainer is done with the batch announced so in ``slot``; a release naming anything but what the"
        " slot holds now (a duplicate, or one from before the slot was re-announced) gets an ``order`` error",
        {
            "trainer_id": id_field(_TID),
            "token": id_field(_TOKEN),
            "slot": int_field("the ring slot the batch was announced in"),
            "epoch": count_field(_EPOCH),
            "batch": count_field(_BATCH),
            "generation": wire_field((int,), _GENERATION, lo=0),
        },
    ),
    Op.HEARTBEAT: Message(
        "the trainer is alive; answered by ``heartbeat``",
        {
            "trainer_id": id_field(_TID),
            "token": id_field(_TOKEN),
            "data_wait_s": wire_field(
                (float, int),
                "seconds this trainer spent waiting for batches since it attached (this session)",
                lo=0,
                hi=1e12,
                optional=True,
            ),
        },
    ),
    Op.DETACH: Message(
        "end the session (the daemon unlinks its ring); answered by ``detached``",
        {"trainer_id": id_field(_TID), "token": id_field(_TOKEN)},
    ),
    Op.STATUS: Message("the daemon's whole state, for ``pixpool status`` and monitors; answered by ``status``"),
    Op.HEALTH: Message("a few dozen bytes for a liveness probe; answered by ``health``"),
    Op.RECORDS: Message(
        "a page of a split's image file names, so a trainer can name its samples; answered by ``records``",
        {
            "start": count_field("the first record of the page"),
            "split": str_field("the split (default ``train``)", choices=SPLITS, optional=True),
            "packed": wire_field(
                (bool,),
                f"send the names as one byte string (``packed``, at most {RECORDS_PAGE_BYTES} bytes) instead of a list",
                optional=True,
            ),
            "sizes": wire_field(
                (bool,),
                "with ``packed``: also each record's decoded (height, width) (``sizes``, at most "
                f"{RECORDS_PAGE_BYTES // 8} records a page), which rect validation batches are planned from",
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
            "trainer_id": int_field(_TID),
            "token": int_field("the session's secret, to send with every later request"),
            "ring": str_field("the name of the trainer's ring in the store"),
            "layout": map_field("the ring's ``RingLayout.to_dict()``"),
            "num_records": int_field("records of the split this trainer streams"),
            "imgsz": int_field("the training size: the snapshot's, which a trainer's ``augment.imgsz`` of None takes"),
            "daemon_pid": int_field("the daemon's process id"),
            "host": str_field("the daemon's host name"),
            "names": wire_field((list,), "the class names", optional=True),
            "task": str_field(
                "what the served dataset's targets carry (``shared/task.py``): it fixes the target row"
                " width (the layout's ``target_width``) and, for segment, the mask planes",
                choices=TASKS,
            ),
            "kpt_shape": wire_field(
                (NONE, list),
                f"pose: the keypoints of an instance, [K, 2 or 3] with 1 <= K <= {MAX_KEYPOINTS}; nil otherwise",
            ),
            "flip_idx": wire_field(
                (NONE, list),
                "pose: the keypoint each of the K becomes under a left-right flip (K integers 0..K-1); nil otherwise",
            ),
            "store": str_field("the directory the ring is in"),
            "pid_ns": wire_field((str,), "the daemon's PID namespace", optional=True),
            "snapshot": wire_field(
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
            "trainer_id": int_field(_TID),
            "delivery": str_field("``shm`` where the nonce matches (and shm was asked for), else ``frames``"),
        },
    ),
    Op.STARTED: Message(
        "the daemon produces the epoch from the batch asked for",
        {
            "trainer_id": int_field(_TID),
            "epoch": int_field(_EPOCH),
            "batch": int_field("the first batch that will be announced"),
            "num_batches": int_field("batches in this epoch"),
        },
    ),
    Op.READY: Message(
        "a batch is in ``slot`` (as frames three more follow: images, targets, samples bytes; a fourth, the mask"
        " planes, where the layout has masks)",
        {
            "trainer_id": int_field(_TID),
            "slot": int_field("the ring slot the batch is in"),
            "epoch": int_field(_EPOCH),
            "batch": int_field(_BATCH),
            "generation": int_field(_GENERATION),
            "size": int_field("the batch's sample count"),
            "n_targets": int_field("the batch's target rows"),
        },
    ),
    Op.HEARTBEAT: Message("the daemon's loop runs and knows this trainer", {"trainer_id": int_field(_TID)}),
    Op.DETACHED: Message("the session is over", {"trainer_id": int_field(_TID)}),
    Op.STATUS: Message(
        "the daemon's state (``shared/wire/status.py``: ``Status``)",
        {
            "daemon": map_field("the daemon's settings and counters"),
            "snapshot": map_field("the training split's snapshot"),
            "splits": wire_field((dict,), "split -> its snapshot", optional=True),
            "workers": list_field("one map per augmentation worker"),
            "trainers": list_field("one map per attached trainer (as many as fit the reply)"),
        },
    ),
    Op.HEALTH: Message(
        "whether the daemon serves",
        {
            "pid": int_field("the daemon's process id"),
            "healthy": wire_field((bool,), "every worker slot has a live worker and none failed to start"),
            "trainers": int_field(
                "attached trainers (their validation passes, sessions on the val split, not counted)"
            ),
            "workers_ready": int_field("workers ready for jobs"),
            "uptime_s": wire_field((float, int), "seconds since the daemon started"),
        },
    ),
    Op.RECORDS: Message(
        "a page of image file names",
        {
            "start": int_field("the first record of the page"),
            "total": int_field("the split's record count"),
            "files": list_field(
                f"the image file names of records ``start`` .. (at most {RECORDS_PAGE}); empty when packed"
            ),
            "names": list_field("the class names"),
            "packed": wire_field(
                (bytes,),
                "asked ``packed``: the names of records ``start`` .. as NUL-terminated UTF-8 (surrogateescape) paths",
                optional=True,
            ),
            "count": int_field("asked ``packed``: how many names ``packed`` holds", optional=True),
            "sizes": wire_field(
                (bytes,),
                "asked ``sizes``: little-endian int32 (height, width) of each of the ``count`` records, 8 bytes each; "
                "absent where the daemon's source keeps no decoded sizes",
                optional=True,
            ),
        },
    ),
    Op.ERROR: Message(
        "a request failed, or the daemon tells a trainer why it ends its session; the client raises"
        " ``error_from`` (the class of ``code`` with the daemon's message), so ``except CapacityError`` works"
        " across the wire",
        {
            "code": str_field("one of ``ERROR_CODES``, each the name of a class of the error tree"),
            "message": str_field("what happened and what to change"),
            "trainer_id": wire_field((int, NONE), "the trainer it concerns (nil: the request's sender)", optional=True),
            "field": wire_field((str, NONE), "the refused setting or message field (may be nil)", optional=True),
        },
    ),
    Op.STOPPED: Message("the daemon is shutting down", {"reason": str_field("why")}),
}


def encode(op: str, **fields: Any) -> bytes:
    """One request frame (trainer -> daemon): ``{v, op, **fields}`` packed with msgpack (no
    extension types), after checking the fields against ``REQUESTS``: ProtocolError naming
    the op and field for one missing, undeclared, mistyped or out of bounds."""
    return _pack(_checked(op, fields, REQUESTS, "request"), fields)


def _checked(op: str, fields: dict[str, Any], table: dict[Op, Message], kind: str) -> Op:
    """The declared op of ``op`` after the sending side's checks of ``fields``."""
    key = check_outgoing(op, fields, table, kind, _HERE)
    _check_shape_of(key.value, fields)
    return key


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
            raise ProtocolError(
                f"op {op!r} is not a request a trainer may send; expected one of {op_names(REQUEST_OPS)}"
            )
        raise ProtocolError(f"op {op!r} is not a reply a daemon sends; expected one of {op_names(REPLIES)}")
    check_fields(op, msg, table[op].fields)
    _check_shape_of(op, msg)
    return msg


_ALL_OPS = frozenset(op.value for op in Op)
# Where a field a sender packs must be declared (the sending side's error says so).
_HERE = "shared/wire/trainer.py"


def _check_shape_of(op: str, msg: dict[str, Any]) -> None:
    """The checks one field's type cannot say: an ``attached`` reply's keypoint shape and flip map."""
    if op == Op.ATTACHED:
        attached_task(msg)


def attached_task(msg: dict[str, Any]) -> TaskSpec:
    """The task an ``attached`` reply names, with its keypoint shape and flip map, as one
    ``TaskSpec``: the one place a trainer reads the served task; ProtocolError for a shape or a
    map that does not fit."""
    kpt_shape, flip_idx = msg.get("kpt_shape"), msg.get("flip_idx")
    if kpt_shape is not None:
        ints = all(isinstance(v, int) and not isinstance(v, bool) for v in kpt_shape)
        if not (ints and len(kpt_shape) == 2 and 1 <= kpt_shape[0] <= MAX_KEYPOINTS and kpt_shape[1] in (2, 3)):
            raise ProtocolError(
                f"op 'attached': field 'kpt_shape' = {kpt_shape!r:.80} must be [K, 2 or 3] "
                f"with 1 <= K <= {MAX_KEYPOINTS}",
                field="kpt_shape",
            )
    spec = task_spec(msg["task"])
    if kpt_shape is None and spec.has_keypoints:
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
    return spec.with_keypoints(kpt_shape, flip_idx)
