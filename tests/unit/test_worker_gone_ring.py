"""A job for a ring its trainer's detach removed is a quiet failure in the worker.

When trainers detach, jobs already sent for their rings can reach a worker after the daemon
removed the rings. The worker answers ``failed`` for such a job (the daemon tells a trainer
that is still attached) and logs it at debug, without an error and its traceback in the
daemon's log for an ordinary detach.

Unit test: ``worker_main`` runs in this process (main thread, its SIGINT setting restored
after) on a pipe that already holds the job and ``stop``; no ring exists under the name.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal

from pixpool.server.daemon.renderer import DEFAULT_RENDERER
from pixpool.server.daemon.worker import worker_main
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
from pixpool.shared.transport.store import Store
from pixpool.shared.wire.worker_pipe import PipeOp, decode_pipe, pipe_frame


def test_a_job_for_a_removed_ring_fails_quietly(tmp_path, caplog):
    settings = StreamSettings(seed=0, batch_size=4, augment=AugmentConfig(imgsz=64)).to_dict()
    daemon_end, worker_end = multiprocessing.Pipe(duplex=True)
    fields = dict(split="train", slot=0, settings=settings, epoch=0, batch=0, size=4, start=0, stop=4)
    daemon_end.send_bytes(pipe_frame(PipeOp.JOB, job=7, ring="pixpool-u0-ring-1-0000000000000000", **fields))
    daemon_end.send_bytes(pipe_frame(PipeOp.STOP))
    old_int = signal.getsignal(signal.SIGINT)
    try:
        with caplog.at_level(logging.DEBUG, logger="pixpool.server.daemon.worker"):
            worker_main(0, worker_end, {}, DEFAULT_RENDERER, os.getpid(), store=Store.of(tmp_path))
    finally:
        signal.signal(signal.SIGINT, old_int)
        worker_end.close()
    replies = []
    try:
        while True:  # what the worker sent, up to the end of the pipe
            replies.append(decode_pipe(daemon_end.recv_bytes()))
    except EOFError:
        pass
    finally:
        daemon_end.close()
    assert [r["op"] for r in replies] == [PipeOp.HELLO, PipeOp.FAILED]
    assert replies[1]["job"] == 7 and replies[1]["error"].startswith("RingGoneError: batch ring")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert "does not exist" in caplog.text  # said once, at debug
