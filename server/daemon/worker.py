"""An augmentation worker: a spawned process that renders batch parts straight into ring slots.

Runs in a worker process started by the daemon's supervisor (``supervisor.py``) with the
spawn method. A worker imports numpy, the fused render kernel and pixpool's own modules;
OpenCV only once copy-paste rasterises a polygon; never torch (a test checks ``sys.modules``).

- It receives the image sources by split (``train``, ``val``: snapshot handles pickle as
  their names and re-attach read-only) and talks to the daemon over one duplex ``multiprocessing`` pipe, using
  ``send_bytes``/``recv_bytes`` with the pipe messages of ``shared/wire/worker_pipe.py`` (msgpack;
  nothing is unpickled after start-up).
- It attaches a trainer's ring on first use and writes its part of the slot in place: the
  images of its sample positions by the renderer (and, in a segment ring, their mask planes:
  the renderer gets them as ``masks_out``), each sample's target rows (the ring's
  ``target_width`` columns, checked) into that position's target region, and the sample
  indices. Other workers write the other positions of the same slot at the same time; the
  daemon packs the targets and writes the slot header once every part is in
  (``shared/transport/ring.py``), so a worker never writes it.
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
from typing import Any, Callable

from ...shared.transport.store import DEFAULT, Store

log = logging.getLogger(__name__)

_POLL_S = 1.0
_EXIT = object()  # what the ``stop`` handler returns


def worker_main(
    index: int, conn: Connection, sources: dict[str, Any], renderer_name: str, parent_pid: int, store: Store = DEFAULT
) -> None:
    """Entry point of a spawned worker process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # No OpenCV here: the fused kernel renders every pixel; only copy-paste's polygon
    # rasterisation imports it, on first use (single-threaded calls on small masks).
    import msgpack

    from ...shared.errors import ProtocolError, RingGoneError
    from ...shared.stream.config import StreamSettings
    from ...shared.transport.ring import Ring
    from ...shared.wire.worker_pipe import PipeOp, decode_pipe, pipe_frame
    from . import renderer as _renderer

    renderer = _renderer.load(renderer_name)
    rings: dict[str, Ring] = {}
    settings_cache: dict[bytes, StreamSettings] = {}

    def on_forget(msg: dict) -> None:
        ring = rings.pop(msg["ring"], None)
        if ring is not None:
            ring.close()

    def on_job(msg: dict) -> bytes:
        t0 = time.perf_counter()
        try:
            key = msgpack.packb(msg["settings"])
            settings = settings_cache.get(key)
            if settings is None:
                settings = settings_cache[key] = StreamSettings.from_dict(msg["settings"])
            ring = rings.get(msg["ring"])
            if ring is None:
                ring = rings[msg["ring"]] = Ring.attach(msg["ring"], store=store)
            counts = _render_into(ring, renderer, sources[msg["split"]], settings, msg)
            return pipe_frame(PipeOp.DONE, job=msg["job"], counts=counts, seconds=time.perf_counter() - t0)
        except RingGoneError as exc:
            # Its trainer detached after the job was sent, and the daemon removed the ring: no
            # fault of this worker's, and nobody to render for (a trainer still attached hears
            # of the failure from the daemon).
            log.debug("worker %d: job %s: %s", index, msg.get("job"), exc)
            return pipe_frame(PipeOp.FAILED, job=msg["job"], error=f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # report any failure of one job; the worker stays up
            log.exception("worker %d: job %s failed", index, msg.get("job"))
            return pipe_frame(PipeOp.FAILED, job=msg["job"], error=f"{type(exc).__name__}: {exc}")

    # What the daemon sends -> what this worker does (``worker_pipe.PIPE``): a reply to send, or
    # None; ``stop`` ends the loop.
    handlers: dict[PipeOp, Callable[[dict], Any]] = {
        PipeOp.JOB: on_job,
        PipeOp.FORGET: on_forget,
        PipeOp.STOP: lambda msg: _EXIT,
    }
    try:
        conn.send_bytes(pipe_frame(PipeOp.HELLO, pid=os.getpid(), index=index))
        while True:
            if not conn.poll(_POLL_S):
                if os.getppid() != parent_pid:
                    return
                continue
            try:
                msg = decode_pipe(conn.recv_bytes())
            except (EOFError, OSError):
                return
            except ProtocolError:
                log.exception("worker %d: unreadable message from the daemon", index)
                continue
            handler = handlers.get(msg["op"])
            if handler is None:
                log.error("worker %d: %r is a message only workers send; ignored", index, msg["op"])
                continue
            reply = handler(msg)
            if reply is _EXIT:
                return
            if reply is not None:
                conn.send_bytes(reply)
    except (BrokenPipeError, EOFError):
        return
    finally:
        for ring in rings.values():
            ring.close()


def _render_into(ring, renderer, source, settings, msg: dict) -> list[int]:
    """Render the part into its positions of the slot (images, mask planes where the ring has
    them, each sample's target rows, samples); returns the target-row count of each of its samples."""
    import numpy as np

    from ...shared.errors import CapacityError

    slot, size, start, stop = msg["slot"], msg["size"], msg["start"], msg["stop"]
    lay = ring.layout
    if not 0 <= start < stop <= size <= lay.batch_size:
        raise ValueError(
            f"part {start}..{stop} of a batch of {size} does not fit ring slots of {lay.batch_size} samples"
        )
    images = ring.images(slot, size)[start:stop]
    # ``masks_out`` only for a ring with masks: a renderer of the tasks without them keeps the
    # signature it always had (``renderer.py``). The planes are drawn in this worker's own
    # zeroed array and copied into the slot once whole: a straggler's duplicate (supervisor.py)
    # killed midway must only ever have written into the slot the bytes the winner wrote, which
    # clearing the slot's planes and drawing there would break (the images are written once per
    # pixel, so there they are).
    extra = {}
    if lay.has_masks:
        m = lay.mask_side
        extra["masks_out"] = planes = np.zeros((stop - start, m, m), dtype=lay.mask_dtype)
    targets, counts, samples = renderer.render_range(
        source, settings, msg["epoch"], msg["batch"], start, stop, images, **extra
    )
    if lay.has_masks:
        ring.masks(slot, size)[start:stop] = planes
    targets = np.asarray(targets)
    counts = [int(c) for c in np.asarray(counts).tolist()]
    if len(counts) != stop - start or len(samples) != stop - start or sum(counts) != len(targets):
        raise ValueError(
            f"renderer returned {len(samples)} samples, {len(counts)} counts summing to {sum(counts)} and {len(targets)} target rows for samples {start}..{stop} of batch {msg['batch']}"
        )
    if len(targets) and (targets.ndim != 2 or targets.shape[1] != lay.target_width):
        raise ValueError(
            f"renderer returned target rows of shape {targets.shape} for samples {start}..{stop} "
            f"of batch {msg['batch']}, "
            f"but this ring's rows have {lay.target_width} columns (the served task's width, shared/task.py); "
            "the route and the daemon disagree on the task"
        )
    per = lay.per_sample
    row = 0
    for p, c in enumerate(counts, start):
        if c > per:
            raise CapacityError(
                f"sample {p} of batch {msg['batch']} has {c} target rows but the ring slot holds {per} per sample; max_targets underestimates"
            )
        ring.sample_targets(slot, p, c)[...] = targets[row : row + c]
        row += c
    ring.samples(slot, size)[start:stop] = samples
    return counts
