"""TCP delivery with CURVE: same bytes as local delivery; unauthenticated peers refused.

Integration test on 127.0.0.1 only (spawned daemon, real route, synthetic snapshot).
"""

from __future__ import annotations

import os
import shutil

import pytest

from helpers.daemon import WAIT_S, digest_of, free_port, real_daemon, reference_stream
from pixpool.client import Client
from pixpool.client.options import ClientOptions
from pixpool.shared.errors import ConfigError, NotAuthorized
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
from pixpool.shared.wire.trainer import encode

IMGSZ = 160


def test_tcp_requires_keys():
    from pixpool.shared.stream.config import DaemonConfig

    with pytest.raises(ConfigError, match="CURVE"):
        DaemonConfig(data="x.json", tcp="127.0.0.1:5555")


def test_tcp_stream_equals_local_and_refuses_strangers(synthetic_data, tmp_path, dealer):
    from pixpool.cli import main
    from pixpool.server.readers import load_dataset
    from pixpool.shared.transport.endpoint import write_keys

    keys = tmp_path / "keys"
    assert main(["keys", str(keys)]) == 0
    secret = (keys / "server.key_secret").read_bytes()
    assert main(["keys", str(keys)]) == 1, "existing keys are not replaced without --force"
    assert (keys / "server.key_secret").read_bytes() == secret
    stranger = tmp_path / "stranger"
    write_keys(stranger)
    shutil.copy(keys / "server.key", stranger / "server.key")  # knows the server, not authorized
    port = free_port()
    s = StreamSettings(seed=31, batch_size=4, augment=AugmentConfig(imgsz=IMGSZ))
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1, tcp=f"127.0.0.1:{port}", keys_dir=str(keys)) as (
        _,
        d,
    ):
        endpoint = f"tcp://127.0.0.1:{port}"
        with Client.connect(s, ClientOptions(endpoint=endpoint, keys_dir=keys, timeout_s=WAIT_S)) as remote:
            assert remote._ring is None  # bytes arrive as frames, no shared memory
            got_remote = [digest_of(b) for b in remote.epoch(0)]
        with Client.connect(s, ClientOptions(socket_dir=d, timeout_s=WAIT_S)) as local:
            got_local = [digest_of(b) for b in local.epoch(0)]
        with pytest.raises(NotAuthorized, match="authorized"):  # told so at once, not after its timeout
            Client.connect(s, ClientOptions(endpoint=endpoint, keys_dir=stranger, timeout_s=WAIT_S))
        plain = dealer(endpoint)
        plain.send(encode("status"))
        assert not plain.poll(2000), "a peer without CURVE keys got an answer"
    assert got_remote == got_local == reference_stream(load_dataset(synthetic_data.coco_json), s, 0)[0]


def test_tcp_bad_address_is_a_clear_error(tmp_path):
    from helpers.daemon import short_socket_dir
    from pixpool.server.daemon.service import Daemon
    from pixpool.shared.stream.config import DaemonConfig
    from pixpool.shared.transport.endpoint import write_keys

    class _Source:
        imgsz, max_instances = 64, 1

        def __len__(self):
            return 1

    write_keys(tmp_path / "k")
    d = short_socket_dir()
    try:
        with pytest.raises(ConfigError, match="cannot listen on tcp://"):
            Daemon(
                _Source(),
                DaemonConfig(data="x.json", workers=1, socket_dir=d, tcp="256.1.1.1:1", keys_dir=str(tmp_path / "k")),
            ).serve()
        assert os.listdir(d) == ["daemon.lock"]  # the ipc socket file went too (the lock file stays, unlocked)
    finally:
        shutil.rmtree(d, ignore_errors=True)
