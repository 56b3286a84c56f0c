"""A flood of idle connections does not take the daemon down.

The daemon runs with its soft AND hard RLIMIT_NOFILE at 1024 (the default for systemd
services and container runtimes, and here it cannot raise it). While a trainer runs, 1,100
idle TCP connections that never send a byte go to its ``--tcp`` port and 1,100 to its
``--metrics-port``, held past a ring sweep (``sweeps.SWEEP_EVERY_S``). The daemon must stay
up, every epoch of the trainer must hold each index exactly once, a TCP trainer from another
address must still get in, the health probe must answer during the flood and the metrics
endpoint once it ends.

The second test drives the TCP guard alone, in this process: idle connections past its
caps per address and in all are shut down at once, the others kept.

Integration tests on loopback addresses only (spawned daemon, real route, synthetic snapshot
at imgsz 160); the flood comes from 127.0.0.2 (and .3), the trainers from 127.0.0.1.
"""

from __future__ import annotations

import re
import socket
import time
import urllib.request

import pytest

from helpers.daemon import WAIT_S, ask_status, daemon_process, free_port, wait_for
from helpers.flood import IdleFlood, raise_own_nofile, run_daemon_with_nofile
from pixpool.client import Client
from pixpool.client.options import ClientOptions
from pixpool.server.daemon.sweeps import SWEEP_EVERY_S
from pixpool.shared.stream.config import AugmentConfig, DaemonConfig, StreamSettings
from pixpool.shared.transport.control import request_health
from pixpool.shared.transport.endpoint import write_keys

IMGSZ = 160
RECORDS = 24  # the synthetic set
NOFILE = 1024
FLOOD = 1100  # per endpoint: more than the daemon's whole descriptor table
FLOOD_FROM = "127.0.0.2"


def _settings(seed: int) -> StreamSettings:
    return StreamSettings(seed=seed, batch_size=4, augment=AugmentConfig(imgsz=IMGSZ))


def _epoch_indices(client: Client, epoch: int) -> list[int]:
    return sorted(i for b in client.epoch(epoch) for i in b.samples.tolist())


def _scrape(port: int) -> str | None:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:  # still busy with the flood's last connections (each has 5 s): asked again
        return None


def test_idle_connection_flood_leaves_the_daemon_serving(synthetic_data, tmp_path):
    if not raise_own_nofile(2 * FLOOD + 256):
        pytest.skip(f"this test opens {2 * FLOOD} sockets; the hard RLIMIT_NOFILE here is lower")
    keys = tmp_path / "keys"
    write_keys(keys)
    tcp_port, metrics_port = free_port(), free_port()
    config = DaemonConfig(
        data=str(synthetic_data.coco_json),
        imgsz=IMGSZ,
        workers=1,
        processes=1,
        tcp=f"127.0.0.1:{tcp_port}",
        keys_dir=str(keys),
        metrics_port=metrics_port,
    )
    every = list(range(RECORDS))
    with daemon_process(config, target=run_daemon_with_nofile, target_kwargs={"nofile": NOFILE}) as (proc, d):
        health_at = f"ipc://{d}/daemon.sock"
        with Client.connect(_settings(1), ClientOptions(socket_dir=d, timeout_s=WAIT_S)) as local, IdleFlood() as flood:
            assert _epoch_indices(local, 0) == every
            flood.open("127.0.0.1", tcp_port, FLOOD, source=FLOOD_FROM)
            flood.open("127.0.0.1", metrics_port, FLOOD, source=FLOOD_FROM)
            held_until = time.monotonic() + SWEEP_EVERY_S + 1.5  # past at least one sweep of the store
            remote_at = f"tcp://127.0.0.1:{tcp_port}"
            with Client.connect(
                _settings(2), ClientOptions(endpoint=remote_at, keys_dir=keys, timeout_s=20.0)
            ) as remote:  # from 127.0.0.1
                assert _epoch_indices(remote, 0) == every
            epoch = 1
            while time.monotonic() < held_until:
                assert _epoch_indices(local, epoch) == every, f"epoch {epoch} under the flood"
                health = request_health(health_at, timeout_s=5.0)
                assert health is not None and health["healthy"], f"health during the flood: {health}"
                epoch += 1
            assert proc.is_alive(), f"the daemon exited with code {proc.exitcode} under the flood"
        # The flood is gone: the metrics endpoint answers again, and says what the guard refused.
        text = wait_for(lambda: _scrape(metrics_port), timeout_s=30.0, what="a scrape")
        refused = re.search(r"^pixpool_tcp_handshakes_refused_total (\S+)$", text, re.MULTILINE)
        assert refused and float(refused.group(1)) >= FLOOD - 64, "the handshake guard did not act"
        assert ask_status(d)["daemon"]["tcp_handshakes_refused"] >= FLOOD - 64, "status does not say what was refused"
        assert proc.is_alive()


def _ended_within(sock: socket.socket, timeout_s: float) -> bool:
    """True when the peer ended ``sock`` (EOF or reset) within ``timeout_s``; what the server
    sends first (its ZMTP greeting) is read and dropped."""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            if not sock.recv(4096):
                return True
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False
    return False


def test_the_guard_caps_unfinished_handshakes_per_address_and_in_all():
    """In-process: a ROUTER with the guard (3 per address, 5 in all); idle TCP connections from
    127.0.0.2 and 127.0.0.3 past those caps are shut down at once, the others kept."""
    import zmq

    from pixpool.server.daemon.handshake_guard import HandshakeGuard

    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.HANDSHAKE_IVL, 30_000)  # nothing closes on time during the test
    port = free_port()
    guard = None
    flood = IdleFlood()
    try:
        guard = HandshakeGuard(ctx, router, port, per_peer=3, total=5)  # before the bind, as the listener does
        router.bind(f"tcp://127.0.0.1:{port}")

        def settle(expected_refused: int) -> None:
            deadline = time.monotonic() + 10.0
            while guard.refused < expected_refused and time.monotonic() < deadline:
                if guard.socket.poll(100):
                    guard.on_events()
            guard.on_events()

        flood.open("127.0.0.1", port, 5, source="127.0.0.2")
        settle(2)
        flood.open("127.0.0.1", port, 3, source="127.0.0.3")
        settle(3)
        ended = [_ended_within(s, 0.3) for s in flood.sockets]  # the refused ones were shut down already
        assert guard.refused == 3 and guard.pending == 5, (guard.refused, guard.pending)
        assert ended.count(True) == 3 and ended[5:].count(False) == 2 and ended[:5].count(False) == 3, ended
    finally:
        flood.close()
        if guard is not None:
            guard.close()
        router.close(linger=0)
        ctx.term()
