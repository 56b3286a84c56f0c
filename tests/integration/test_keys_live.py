"""The daemon admits exactly the CURVE keys in ``authorized/`` now: a key added is admitted
and a key removed is refused without a restart, the sessions of a removed key end, and a
trainer whose key is refused is told so at once (``NotAuthorized``), not after its timeout.

Integration test over loopback TCP+CURVE on a random port (spawned daemon, real route,
synthetic snapshot at imgsz 160).
"""

from __future__ import annotations

import shutil
import time

import pytest

from helpers.daemon import WAIT_S, ask_status, free_port, real_daemon, wait_for
from pixpool.client import Client
from pixpool.client.options import ClientOptions
from pixpool.shared.errors import NotAuthorized
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
from pixpool.shared.transport.endpoint import write_keys

IMGSZ = 160
# A refused handshake is reported within a round trip; 10 s is far under the trainer's 60 s
# timeout, which is what it waited before.
PROMPT_S = 10.0


def _settings() -> StreamSettings:
    return StreamSettings(seed=4, batch_size=4, augment=AugmentConfig(imgsz=IMGSZ))


def test_authorized_keys_are_read_live(synthetic_data, tmp_path):
    keys = tmp_path / "keys"
    write_keys(keys)
    late = tmp_path / "late"  # a trainer's key pair for the same server, authorized later
    write_keys(late)
    shutil.copy(keys / "server.key", late / "server.key")
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1, tcp=endpoint[6:], keys_dir=str(keys)) as (_, d):
        t0 = time.monotonic()
        with pytest.raises(NotAuthorized) as err:
            Client.connect(_settings(), ClientOptions(endpoint=endpoint, keys_dir=late, timeout_s=WAIT_S))
        assert time.monotonic() - t0 < PROMPT_S, "the refused trainer was not told promptly"
        assert str(late / "client.key") in str(err.value) and "authorized" in str(err.value)

        shutil.copy(late / "client.key", keys / "authorized" / "late.key")  # no restart
        with Client.connect(_settings(), ClientOptions(endpoint=endpoint, keys_dir=late, timeout_s=WAIT_S)) as c:
            it = c.epoch(0)
            assert next(it).images.shape[0] == 4
            it.close()

        with Client.connect(_settings(), ClientOptions(endpoint=endpoint, keys_dir=keys, timeout_s=WAIT_S)) as c:
            it = c.epoch(0)
            assert next(it).images.shape[0] == 4
            assert len(ask_status(d)["trainers"]) == 1
            (keys / "authorized" / "client.key").unlink()
            t0 = time.monotonic()
            with pytest.raises(NotAuthorized):
                for epoch in range(1000):
                    for _ in it:
                        assert time.monotonic() - t0 < PROMPT_S, "a removed key's session went on"
                    it = c.epoch(epoch + 1)
            wait_for(
                lambda: ask_status(d)["trainers"] == [], timeout_s=PROMPT_S, what="the removed key's session ended"
            )
        with pytest.raises(NotAuthorized):
            Client.connect(_settings(), ClientOptions(endpoint=endpoint, keys_dir=keys, timeout_s=WAIT_S))
