"""The one-shot control request: ask a daemon for its status over a fresh DEALER socket.

Runs in whichever process asks: ``pixpool status``/``monitor``/``demo`` (trainer side),
a starting daemon checking whether another one still answers on its socket, and tests.
The socket is made, used and closed (linger 0) inside the call.
"""

from __future__ import annotations

from typing import Any

import zmq

from . import protocol as proto


def request_status(endpoint: str, *, timeout_s: float = 3.0, ctx: zmq.Context | None = None) -> dict[str, Any] | None:
    """The daemon's ``status`` reply at ``endpoint``, or None when none came within ``timeout_s``."""
    context = ctx or zmq.Context.instance()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        sock.send(proto.encode("status"))
        if not sock.poll(int(timeout_s * 1000)):
            return None
        return proto.decode(sock.recv(), reply=True)
    finally:
        sock.close(linger=0)
