"""The daemon's log names a trainer's validation stream as such, never as another trainer, and
keeps the per-pass validation lines at debug: the operator's log is the trainers'."""

from __future__ import annotations

import logging
import os

from pixpool.server.daemon import sessions as sessions_mod
from pixpool.server.daemon.scheduler import Scheduler
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
from pixpool.shared.transport.ring import RingLayout


def test_log_says_trainer_or_validation_stream(caplog):
    sessions = sessions_mod.Sessions(os.getpid(), Scheduler(), heartbeat_timeout_s=10.0, on_detach=lambda name: None)
    layout = RingLayout(slots=2, batch_size=2, imgsz=32, max_targets=4)
    msg = {"pid": os.getpid(), "host": "h", "delivery": "shm"}
    val = StreamSettings(split="val", augment=AugmentConfig(train_route=False))
    caplog.set_level(logging.DEBUG, logger=sessions_mod.__name__)
    try:
        train = sessions.attach(msg, StreamSettings(), layout, sock=None, identity=b"x")
        passes = sessions.attach(msg, val, layout, sock=None, identity=b"y")
        sessions.detach(passes.trainer_id, "pass over")
    finally:
        sessions.detach_all("test over")
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith(f"trainer {train.trainer_id} attached (pid") for m in said), said
    val_name = f"trainer {train.trainer_id}'s validation stream"
    assert any(m.startswith(f"{val_name} attached (pid") for m in said), said
    assert any(m.startswith(f"{val_name} detached: pass over") for m in said), said
    assert not any(m.startswith(f"trainer {passes.trainer_id} ") for m in said), said
    at_info = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert not any("validation stream" in m for m in at_info), at_info
