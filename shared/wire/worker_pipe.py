"""The worker pipe: the messages between the daemon and its augmentation workers.

Runs in the daemon (``server/daemon/supervisor.py``) and in each worker it spawns
(``server/daemon/worker.py``), one ``multiprocessing`` pipe per worker. A message is a msgpack
map with ``op`` (a ``PipeOp``) and the fields the table ``PIPE`` declares (``shared.schema``
declarations, as the trainer protocol's are); nothing is unpickled after start-up. There is no
version: both ends are the same installation. ``pipe_frame`` checks what it packs, and
``decode_pipe`` what arrives, raising ``ProtocolError`` naming the op and field; each side
dispatches through a table keyed by ``PipeOp``.
"""

from __future__ import annotations

import enum
from typing import Any

import msgpack

from ..errors import ProtocolError
from ..schema import Message
from ._fields import (
    INT_LIMIT,
    check_fields,
    check_outgoing,
    int_field,
    list_field,
    map_field,
    op_names,
    str_field,
    wire_field,
)

__all__ = ["PIPE", "PipeOp", "decode_pipe", "pipe_frame"]


class PipeOp(enum.StrEnum):
    """The operations on a daemon <-> worker pipe; each member is its string on the pipe."""

    JOB = "job"
    FORGET = "forget"
    STOP = "stop"
    HELLO = "hello"
    DONE = "done"
    FAILED = "failed"


PIPE: dict[PipeOp, Message] = {
    PipeOp.JOB: Message(
        "daemon -> worker: render sample positions ``start .. stop`` of a batch of ``size`` samples of that"
        " split's source into those positions of ``slot``",
        {
            "job": int_field("the job's id, echoed in ``done``/``failed``"),
            "ring": str_field("the trainer's ring"),
            "split": str_field("the split whose source is rendered"),
            "slot": int_field("the ring slot"),
            "settings": map_field("the stream's ``StreamSettings.to_dict()``"),
            "epoch": int_field("the epoch the batch belongs to"),
            "batch": int_field("the batch's position in its epoch"),
            "size": int_field("the batch's sample count"),
            "start": int_field("the first sample position of the part"),
            "stop": int_field("one past the last sample position of the part"),
        },
    ),
    PipeOp.FORGET: Message("daemon -> worker: close that ring (its trainer left)", {"ring": str_field("the ring")}),
    PipeOp.STOP: Message("daemon -> worker: exit"),
    PipeOp.HELLO: Message(
        "worker -> daemon, once ready", {"pid": int_field("the worker's pid"), "index": int_field("its worker slot")}
    ),
    PipeOp.DONE: Message(
        "worker -> daemon: a part is written",
        {
            "job": int_field("the job's id"),
            "counts": list_field("target rows of each sample of the part"),
            "seconds": wire_field((float, int), "how long the part took"),
        },
    ),
    PipeOp.FAILED: Message(
        "worker -> daemon: a part failed",
        {"job": int_field("the job's id"), "error": str_field("the exception, as text")},
    ),
}


def pipe_frame(op: str, **fields: Any) -> bytes:
    """One pipe message (no version: both ends are the same installation), checked against ``PIPE``."""
    key = check_outgoing(op, fields, PIPE, "pipe", "shared/wire/worker_pipe.py")
    return msgpack.packb({"op": key.value, **fields}, use_bin_type=True)


def decode_pipe(frame: bytes) -> dict[str, Any]:
    """Parse and validate one pipe message; ProtocolError names what is wrong."""
    try:
        msg = msgpack.unpackb(frame, raw=False, strict_map_key=True)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise ProtocolError(f"pipe message of {len(frame)} bytes is not valid msgpack ({exc})") from None
    op = msg.get("op") if isinstance(msg, dict) else None
    if not isinstance(op, str) or op not in PIPE:
        raise ProtocolError(f"unknown pipe op {op!r}; expected one of {op_names(PIPE)}")
    check_fields(op, msg, PIPE[op].fields)
    # A field's type cannot say what each element of a list must be.
    if op == PipeOp.DONE and not all(
        isinstance(c, int) and not isinstance(c, bool) and 0 <= c < INT_LIMIT for c in msg["counts"]
    ):
        raise ProtocolError(
            f"op 'done': field 'counts' must be a list of target-row counts (integers >= 0), got {msg['counts']!r:.200}"
        )
    return msg
