"""Reading one request off a daemon ROUTER socket, keeping no more of it than the protocol allows.

Runs in the daemon process, inside its loop (``service.Daemon._drain``), on every socket a
client can write to (the ipc one and the TCP+CURVE one; the workers read only the daemon's
pipes). A request is the peer's routing id and ``MAX_REQUEST_FRAMES`` msgpack frame of at
most ``MAX_FRAME_BYTES``; ``recv_multipart`` would copy every frame of whatever a peer sent
into Python bytes first (1,500 frames of 1 MB: about 2.7 GB of daemon RSS).

What bounds a message, layer by layer:

- libzmq refuses (and drops the peer of) any one frame over ``MAX_WIRE_BYTES``
  (``ZMQ_MAXMSGSIZE``, set by ``listener.Listener``) before allocating it;
- here frames are read one at a time (``RCVMORE``): past the frame or byte limit nothing is
  kept, the rest of the message is received and freed frame by frame, and the caller
  answers a ``protocol`` error;
- libzmq delivers a multipart message atomically, so its frames wait in libzmq's own queue
  until the last one arrived: a peer may make the daemon hold up to (frames it sends) x
  ``MAX_WIRE_BYTES`` for as long as that message takes to arrive. Once it is read and
  dropped here, ``_give_back_memory`` returns the freed pages to the kernel (glibc keeps
  freed blocks of libzmq's I/O thread arena otherwise), so the daemon's RSS comes back.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from dataclasses import dataclass

import zmq

from ...shared.wire.trainer import MAX_REQUEST_BYTES, MAX_REQUEST_FRAMES, MAX_WIRE_BYTES

log = logging.getLogger(__name__)

# Dropped messages larger than this are followed by malloc_trim: below it the freed blocks
# are few and glibc reuses them anyway.
_TRIM_AFTER_NBYTES = 4 * MAX_WIRE_BYTES


@dataclass
class Request:
    """One message read off a ROUTER socket: the peer's routing id, the frames kept (at most
    ``MAX_REQUEST_FRAMES``), and how many body frames and bytes the peer really sent."""

    identity: bytes
    frames: list[bytes]
    frames_sent: int
    nbytes_sent: int
    peer: str = ""  # who sent it (``peer_of``): ``key:<z85>`` over TCP+CURVE, ``uid:<n>`` over ipc

    def problem(self) -> str | None:
        """Why this message is no request (for the ``protocol`` error reply), or None."""
        if self.frames_sent != MAX_REQUEST_FRAMES:
            return f"expected one message frame, got {self.frames_sent}; a request is one msgpack frame"
        if self.nbytes_sent > MAX_REQUEST_BYTES:
            return (
                f"message of {self.nbytes_sent} bytes exceeds the limit of {MAX_REQUEST_BYTES} bytes "
                "for a request; "
                "a control message is a few hundred bytes"
            )
        return None


def read_request(sock: zmq.Socket, *, remote: bool = False) -> Request | None:
    """The next message on ``sock`` (a ROUTER), or None when none is waiting. Never keeps
    more than ``MAX_REQUEST_FRAMES`` frames of ``MAX_REQUEST_BYTES`` in all. ``remote``: the
    TCP+CURVE socket (the peer is named by its key, else by its uid)."""
    try:
        first = sock.recv(zmq.NOBLOCK, copy=False)
    except zmq.Again:
        return None
    identity = first.bytes
    more = first.more
    del first
    kept: list[bytes] = []
    frames = nbytes = 0
    peer = ""
    while more:
        # The rest of a multipart message is already in libzmq's queue: no wait here.
        frame = sock.recv(copy=False)
        more = frame.more
        frames += 1
        nbytes += len(frame)
        if frames == 1:
            peer = peer_of(frame, remote=remote)
        if frames <= MAX_REQUEST_FRAMES and nbytes <= MAX_REQUEST_BYTES:
            kept.append(frame.bytes)
        elif kept:
            kept.clear()  # past a limit: nothing of this message is used
        del frame  # frees libzmq's buffer of this frame now, not at the end of the message
    req = Request(identity, kept, frames, nbytes, peer)
    if req.problem() is not None:
        log.debug("dropped a message of %d frames, %d bytes from peer %r", frames, nbytes, identity)
        if nbytes > _TRIM_AFTER_NBYTES:
            _give_back_memory()
    return req


def peer_of(frame: zmq.Frame, *, remote: bool) -> str:
    """Who sent ``frame``, from the metadata libzmq attaches to every frame of a connection.

    Over TCP+CURVE: the client's public key, which the ZAP handler admitted and returned as
    the connection's ``User-Id`` (z85 text). Over ipc: the peer's uid, which libzmq reads
    with ``SO_PEERCRED`` when the connection is accepted and appends to ``Peer-Address``
    (``<addr>:<uid>:<gid>:<pid>``, libzmq's ``stream_engine_base.cpp``). The kernel fills
    the credentials in, translated to the daemon's namespaces, so a peer cannot forge them
    and they hold across PID namespaces. "" where libzmq gave no such property."""
    try:
        if remote:
            return f"key:{frame.get('User-Id')}"
        parts = frame.get("Peer-Address").rsplit(":", 3)
    except zmq.ZMQError:  # no such property on this connection
        return ""
    return f"uid:{parts[1]}" if len(parts) == 4 and parts[1].isdigit() else ""


def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None


_TRIM = _malloc_trim()


def _give_back_memory() -> None:
    """Return freed heap pages of every arena to the kernel (glibc ``malloc_trim``)."""
    if _TRIM is not None:
        _TRIM(0)
