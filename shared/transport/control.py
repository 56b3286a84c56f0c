"""The one-shot control requests: ask a daemon for its status, or its health, over a fresh
DEALER socket.

Runs in whichever process asks: ``pixpool status``/``monitor``/``demo`` (trainer side),
``pixpool status --probe`` (liveness and readiness probes: ``health`` costs the same
however many trainers are attached), a starting daemon checking whether another one still
answers on its socket, and tests.
The socket is made, used and closed (linger 0) inside the call.
"""

from __future__ import annotations

from typing import Any

import zmq

from ..wire.trainer import decode, encode


def request_status(endpoint: str, *, timeout_s: float = 3.0, ctx: zmq.Context | None = None) -> dict[str, Any] | None:
    """The daemon's ``status`` reply at ``endpoint``, or None when none came within ``timeout_s``."""
    return _request("status", endpoint, timeout_s=timeout_s, ctx=ctx)


def request_health(endpoint: str, *, timeout_s: float = 3.0, ctx: zmq.Context | None = None) -> dict[str, Any] | None:
    """The daemon's ``health`` reply (pid, healthy, counts: a few dozen bytes), or None."""
    return _request("health", endpoint, timeout_s=timeout_s, ctx=ctx)


def _request(op: str, endpoint: str, *, timeout_s: float, ctx: zmq.Context | None) -> dict[str, Any] | None:
    context = ctx or zmq.Context.instance()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        sock.send(encode(op))
        if not sock.poll(int(timeout_s * 1000)):
            return None
        return decode(sock.recv(), reply=True)
    finally:
        sock.close(linger=0)
