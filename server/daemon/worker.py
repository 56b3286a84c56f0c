"""An augmentation worker: a spawned process that renders batches straight into ring slots.

Runs in a worker process started by the daemon's supervisor (``supervisor.py``) with the
spawn method. A worker imports numpy, the fused render kernel and pixpool's own modules;
OpenCV only once copy-paste rasterises a polygon; never torch (a test checks ``sys.modules``).

- It receives the image sources by split (``train``, ``val``: snapshot handles pickle as
  their names and re-attach read-only) and talks to the daemon over one duplex ``multiprocessing`` pipe, using
  ``send_bytes``/``recv_bytes`` with the pipe messages of ``shared/protocol.py`` (msgpack;
  nothing is unpickled after start-up).
- It attaches a trainer's ring on first use and writes the slot in place: images by the
  renderer, then targets and samples, and the slot header last.
- It ignores SIGINT (Ctrl-C in the daemon's terminal reaches the whole process group; the
  daemon decides when workers stop) and exits when the daemon goes: the pipe reports EOF,
  and the parent pid is polled as a backstop.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from multiprocessing.connection import Connection
from typing import Any

log = logging.getLogger(__name__)

_POLL_S = 1.0


def worker_main(index: int, conn: Connection, sources: dict[str, Any], renderer_name: str, parent_pid: int) -> None:
    """Entry point of a spawned worker process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # No OpenCV here: the fused kernel renders every pixel; only copy-paste's polygon
    # rasterisation imports it, on first use (single-threaded calls on small masks).
    import msgpack

    from ...shared import protocol as proto
    from ...shared.config import StreamSettings
    from ...shared.errors import ProtocolError
    from ...shared.ring import Ring
    from . import renderer as _renderer

    renderer = _renderer.load(renderer_name)
    rings: dict[str, Ring] = {}
    settings_cache: dict[bytes, StreamSettings] = {}
    try:
        conn.send_bytes(proto.pipe_frame("hello", pid=os.getpid(), index=index))
        while True:
            if not conn.poll(_POLL_S):
                if os.getppid() != parent_pid:
                    return
                continue
            try:
                msg = proto.decode_pipe(conn.recv_bytes())
            except (EOFError, OSError):
                return
            except ProtocolError:
                log.exception("worker %d: unreadable message from the daemon", index)
                continue
            op = msg["op"]
            if op == "stop":
                return
            if op == "forget":
                ring = rings.pop(msg["ring"], None)
                if ring is not None:
                    ring.close()
                continue
            if op != "job":
                continue
            t0 = time.perf_counter()
            try:
                key = msgpack.packb(msg["settings"])
                settings = settings_cache.get(key)
                if settings is None:
                    settings = settings_cache[key] = StreamSettings.from_dict(msg["settings"])
                ring = rings.get(msg["ring"])
                if ring is None:
                    ring = rings[msg["ring"]] = Ring.attach(msg["ring"])
                n_targets = _render_into(ring, renderer, sources[msg["split"]], settings, msg)
                reply = proto.pipe_frame("done", job=msg["job"], size=msg["size"], n_targets=n_targets, seconds=time.perf_counter() - t0)
            except Exception as exc:  # report any failure of one job; the worker stays up
                log.exception("worker %d: job %s failed", index, msg.get("job"))
                reply = proto.pipe_frame("failed", job=msg["job"], error=f"{type(exc).__name__}: {exc}")
            conn.send_bytes(reply)
    except (BrokenPipeError, EOFError):
        return
    finally:
        for ring in rings.values():
            ring.close()


def _render_into(ring, renderer, source, settings, msg: dict) -> int:
    """Render the job into its slot (images, targets, samples, then the header); the target count."""
    from ...shared.errors import CapacityError

    slot, size = msg["slot"], msg["size"]
    images = ring.images(slot, size)
    targets, samples = renderer.render(source, settings, msg["epoch"], msg["batch"], images)
    n = len(targets)
    if n > ring.layout.max_targets:
        raise CapacityError(f"batch {msg['batch']} has {n} target rows but the ring slot holds {ring.layout.max_targets}; max_targets underestimates")
    if len(samples) != size:
        raise ValueError(f"renderer returned {len(samples)} samples for a batch of {size}")
    ring.targets(slot, n)[...] = targets
    ring.samples(slot, size)[...] = samples
    ring.write_header(slot, epoch=msg["epoch"], batch=msg["batch"], size=size, n_targets=n, job=msg["job"])
    return n
