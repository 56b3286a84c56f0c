"""The ``status`` and ``health`` replies as declared values (``shared/wire/status.py``): what
``to_wire`` sends is the map the replies always carried, key for key and in order, and
``from_wire`` reads a reply back the way its readers did (a field left out takes its default)."""

from __future__ import annotations

import json

import msgpack
import pytest

from pixpool.shared.errors import ProtocolError
from pixpool.shared.stream.config import StreamSettings
from pixpool.shared.wire.status import Health, Status, TrainerStatus, as_reply
from pixpool.shared.wire.trainer import Op, decode, encode_reply

SNAPSHOT = {
    "records": 24,
    "imgsz": 160,
    "max_instances": 6,
    "task": "detect",
    "name": "pixpool-u0-snap-0123",
    "content": "ab",
    "reused": False,
    "prepare_s": 0.3,
    "segments": ["pixpool-u0-snap-0123-meta", "pixpool-u0-snap-0123-img"],
    "dtype": "uint8",
    "store": "/dev/shm",
    "image_bytes": 10,
    "index_bytes": 2,
    "target_bytes": 3,
    "polygon_bytes": 0,
    "keypoint_bytes": 0,
    "decoded_bytes": 10,
    "classes": 8,
    "served": {"data": "/d/data.yaml", "images": None, "split": "train", "task": "detect"},
}
TRAINER = {
    "trainer_id": 1,
    "pid": 42,
    "host": "h",
    "delivery": "shm",
    "pid_watched": True,
    "settings": StreamSettings(seed=3, batch_size=4).to_dict(),
    "split": "train",
    "of_trainer": 1,
    "epoch": 0,
    "next_batch": 2,
    "num_batches": 6,
    "batches_delivered": 1,
    "images_delivered": 4,
    "img_per_s": 12.5,
    "slots": 3,
    "slots_in_use": 1,
    "ring": "pixpool-u0-ring-1",
    "ring_nbytes": 4096,
    "ring_mask_nbytes": 0,
    "last_seen_s": 0.1,
    "attached_s": 2.0,
    "data_wait_s": 0.5,
}


def _reply() -> dict:
    daemon = {
        "pid": 7,
        "host": "h",
        "store": "/dev/shm",
        "pid_ns": "pid:[1]",
        "version": "0.1.0",
        "protocol": 4,
        "endpoint": "ipc:///tmp/d/daemon.sock",
        "tcp": "",
        "uptime_s": 3.5,
        "worker_restarts": 0,
        "redispatched_jobs": 0,
        "heartbeat_timeout_s": 10.0,
        "memory_budget_nbytes": None,
        "store_warn_free_nbytes": 1 << 20,
        "store_low": False,
        "metrics": "",
        "trainers_total": 1,
        "housekeeping_errors": 0,
        "tcp_handshakes_refused": 0,
    }
    workers = [
        {"index": 0, "pid": 8, "state": "idle", "parts_done": 1, "samples_done": 4, "busy_s": 0.2, "ready_s": 0.1}
    ]
    return {
        "daemon": daemon,
        "snapshot": SNAPSHOT,
        "splits": {"train": SNAPSHOT, "val": {**SNAPSHOT, "reused": True}},
        "workers": workers,
        "trainers": [TRAINER],
    }


def test_a_reply_read_and_sent_again_is_the_same_bytes():
    frame = encode_reply(Op.STATUS, **_reply())
    msg = decode(frame, reply=True)
    st = Status.from_wire(msg)
    assert encode_reply(Op.STATUS, **st.to_wire()) == frame
    assert json.dumps(as_reply(Op.STATUS, st)) == json.dumps(msg)  # `pixpool status --json`
    h = {"pid": 7, "healthy": True, "trainers": 1, "workers_ready": 2, "uptime_s": 3.5}
    health = decode(encode_reply(Op.HEALTH, **h), reply=True)
    assert json.dumps(as_reply(Op.HEALTH, Health.from_wire(health))) == json.dumps(health)


def test_the_values_read_as_attributes():
    st = Status.from_wire(_reply())
    (t,) = st.trainers
    assert (st.daemon.pid, st.snapshot.segments, st.splits["val"].reused) == (7, tuple(SNAPSHOT["segments"]), True)
    assert t.settings == StreamSettings(seed=3, batch_size=4) and not t.is_validation and t.watched
    assert t.wait_share == 0.25 and st.trainers_unlisted == 0 and st.workers[0].ready


def test_fields_left_out_take_their_defaults_and_stay_out():
    st = Status.from_wire({"daemon": {"pid": 1}, "trainers": [{"trainer_id": 2, "delivery": "shm", "split": "val"}]})
    assert st.splits is None and st.served == {"train": st.snapshot} and st.daemon.store is None
    (t,) = st.trainers
    assert t.is_validation and t.watched and t.pid_watched is None and "pid_watched" not in t.to_wire()
    assert "name" not in st.snapshot.to_wire() and "splits" not in st.to_wire()
    assert st.trainers_unlisted == 0  # a daemon that does not say how many are attached


def test_a_field_of_the_wrong_type_is_a_protocol_error():
    with pytest.raises(ProtocolError, match="trainer.ring_nbytes"):
        TrainerStatus.from_wire({**TRAINER, "ring_nbytes": "big"})
    with pytest.raises(ProtocolError, match="workers must be a list"):
        Status.from_wire({"workers": {"0": {}}})
    with pytest.raises(ProtocolError, match="settings"):
        TrainerStatus.from_wire({**TRAINER, "settings": [1]})
    with pytest.raises(ProtocolError, match="settings"):
        _ = TrainerStatus.from_wire({**TRAINER, "settings": {"seed": -1}}).settings  # read where asked for


def test_a_trainer_entry_packs_as_the_daemon_measured_it():
    t = TrainerStatus.from_wire(TRAINER)
    assert msgpack.packb(t.to_wire(), use_bin_type=True) == msgpack.packb(TRAINER, use_bin_type=True)
