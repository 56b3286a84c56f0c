"""Frames a peer other than pixpool may send: packed as the protocol packs them, but unchecked.

Runs in the pytest process. ``protocol.encode`` refuses to send a missing, undeclared or
out-of-bounds field; the daemon must refuse such frames from any peer all the same, and these
tests send them with ``raw_frame``.
"""

from __future__ import annotations

from typing import Any

import msgpack

from pixpool.shared.wire.trainer import PROTOCOL_VERSION


def raw_frame(op: str, **fields: Any) -> bytes:
    """``{v, op, **fields}`` packed with msgpack, as ``encode`` would, without its checks."""
    return msgpack.packb({"v": PROTOCOL_VERSION, "op": str(op), **fields}, use_bin_type=True)
