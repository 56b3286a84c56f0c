"""Floods of idle connections lock no one out: authorized TCP trainers, metrics scrapes.

Idle connections that never finish a handshake, 32 from each of 40 loopback addresses (each
address under the cap per address, all together past the cap in all), are opened again the
moment the daemon ends one. An authorized trainer from yet another address must still
attach and be served while that flood holds; the handshake guard makes room by shutting
down the oldest unfinished connection, never a connection that completed its CURVE
handshake.

The second test drives the guard alone, in this process, with a real CURVE handshake. The
third holds 64 and then 256 idle connections against the daemon's metrics endpoint (16
slots): three scrapes must each be answered with the metrics within Prometheus' default
scrape timeout (10 s).

Integration tests on loopback addresses only (spawned daemon, real route, synthetic snapshot
at imgsz 160); the floods come from 127.0.0.2 and 127.0.0.10-49, the trainers and scrapes
from 127.0.0.1.
"""

from __future__ import annotations

import re
import time

import pytest

from helpers.daemon import ask_status, daemon_process, free_port, wait_for
from helpers.flood import HeldFlood, IdleFlood, raise_own_nofile
from pixpool.client import Client
from pixpool.client.options import ClientOptions
from pixpool.server.daemon.handshake_guard import pending_caps
from pixpool.shared.stream.config import AugmentConfig, DaemonConfig, StreamSettings
from pixpool.shared.transport.endpoint import write_keys

IMGSZ = 160
RECORDS = 24  # the synthetic set
PER_ADDRESS = 32
SOURCES = [f"127.0.0.{i}" for i in range(10, 50)]  # 40 addresses: 1,280 connections
ATTACH_DEADLINE_S = 15.0
SCRAPE_TIMEOUT_S = 10.0  # Prometheus' default scrape_timeout


def _settings(seed: int) -> StreamSettings:
    return StreamSettings(seed=seed, batch_size=4, augment=AugmentConfig(imgsz=IMGSZ))


def _refused(socket_dir: str) -> int | None:
    status = ask_status(socket_dir)
    return None if status is None else status["daemon"]["tcp_handshakes_refused"]


def test_a_trainer_attaches_while_a_flood_from_many_addresses_holds_the_cap(synthetic_data, tmp_path):
    if not raise_own_nofile(len(SOURCES) * PER_ADDRESS + 512):
        pytest.skip("this test holds 1,280 sockets; the hard RLIMIT_NOFILE here is lower")
    per_peer, total = pending_caps(1 << 20)
    if per_peer != PER_ADDRESS or len(SOURCES) * PER_ADDRESS <= total:
        pytest.skip(f"the flood is sized for caps of 32 per address and 1,024 in all, not {per_peer} and {total}")
    keys = tmp_path / "keys"
    write_keys(keys)
    port = free_port()
    config = DaemonConfig(
        data=str(synthetic_data.coco_json),
        imgsz=IMGSZ,
        workers=1,
        processes=1,
        tcp=f"127.0.0.1:{port}",
        keys_dir=str(keys),
    )
    with daemon_process(config) as (proc, d):
        status = ask_status(d)
        if status is None:
            pytest.fail("the daemon does not answer its status before the flood")
        with HeldFlood("127.0.0.1", port, SOURCES, PER_ADDRESS) as flood:
            # The flood holds the cap in all once the guard has shut down at least the excess.
            excess = len(SOURCES) * PER_ADDRESS - 1024
            try:
                wait_for(lambda: (_refused(d) or 0) >= excess, timeout_s=180.0, what="the flood to reach the cap")
            except TimeoutError as exc:
                pytest.fail(
                    f"{exc}: {_refused(d)} of {excess} shut down by the guard; the flood holds "
                    f"{flood.open_count}, reopened {flood.reopened}, failed {flood.failed}"
                )
            t0 = time.monotonic()
            with Client.connect(
                _settings(5),
                ClientOptions(endpoint=f"tcp://127.0.0.1:{port}", keys_dir=keys, timeout_s=ATTACH_DEADLINE_S),
            ) as remote:
                attach_s = time.monotonic() - t0
                got = sorted(i for b in remote.epoch(0) for i in b.samples.tolist())
            assert flood.open_count >= len(SOURCES) * PER_ADDRESS - 8, "the flood did not hold while the trainer ran"
            assert got == list(range(RECORDS)), f"epoch 0 under the flood (attached in {attach_s:.1f} s)"
            assert proc.is_alive(), f"the daemon exited with code {proc.exitcode} under the flood"


def test_the_guard_makes_room_from_the_oldest_unfinished_and_spares_finished_handshakes(tmp_path):
    """In-process: a CURVE ROUTER with the guard (2 per address, 4 in all). An authorized
    DEALER completes its handshake first; idle connections from four addresses then go past
    both caps. Each newcomer is kept and the oldest unfinished connection (its own address's
    first) is shut down; the trainer's connection is never shut down and still carries messages."""
    import zmq

    from pixpool.server.daemon.authorized import AuthorizedKeys
    from pixpool.server.daemon.handshake_guard import HandshakeGuard
    from pixpool.shared.transport import endpoint as ep

    keys = tmp_path / "keys"
    write_keys(keys)
    ctx = zmq.Context()
    authorized = AuthorizedKeys(keys)
    authorized.current()
    auth = ep.start_authenticator(ctx, keys, authorized)
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.HANDSHAKE_IVL, 30_000)  # nothing closes on time during the test
    ep.configure_server(router, keys)
    trainer = ctx.socket(zmq.DEALER)
    trainer.setsockopt(zmq.LINGER, 0)
    ep.configure_client(trainer, keys)
    port = free_port()
    guard = None
    flood = IdleFlood()
    try:
        guard = HandshakeGuard(ctx, router, port, per_peer=2, total=4)  # before the bind, as the listener does
        router.bind(f"tcp://127.0.0.1:{port}")

        def settle(expected_refused: int) -> None:
            deadline = time.monotonic() + 10.0
            while guard.refused < expected_refused and time.monotonic() < deadline:
                if guard.socket.poll(100):
                    guard.on_events()
            guard.on_events()

        trainer.connect(f"tcp://127.0.0.1:{port}")
        trainer.send(b"before")
        assert router.poll(10_000), "the trainer's first message did not arrive"
        assert router.recv_multipart()[1] == b"before"
        settle(0)
        assert guard.pending == 1  # the trainer's connection, finished but younger than the interval

        flood.open("127.0.0.1", port, 3, source="127.0.0.2")  # one past the cap per address
        settle(1)
        flood.open("127.0.0.1", port, 2, source="127.0.0.3")  # past the cap in all
        settle(2)
        flood.open("127.0.0.1", port, 1, source="127.0.0.4")  # new addresses, the cap in all reached
        flood.open("127.0.0.1", port, 1, source="127.0.0.5")
        settle(3)
        ended = [_ended_within(s, 0.3) for s in flood.sockets]
        # .2's first made room for .2's third (its own address first), .3's first for .3's
        # second; for .4 the oldest of all, the trainer's, was found finished and only
        # forgotten; for .5 the oldest unfinished of all, .2's second, was shut down.
        assert ended == [True, True, False, True, False, False, False], ended
        assert guard.refused == 3 and guard.pending == 4, (guard.refused, guard.pending)
        trainer.send(b"after")
        assert router.poll(10_000), "the trainer's connection was cut by the guard"
        assert router.recv_multipart()[1] == b"after"
    finally:
        flood.close()
        trainer.close(linger=0)
        if guard is not None:
            guard.close()
        router.close(linger=0)
        auth.stop()
        ctx.term()


def _ended_within(sock, timeout_s: float) -> bool:
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


def _scrape(port: int) -> str | None:
    """The metrics, or None where the scrape was not answered within ``SCRAPE_TIMEOUT_S``."""
    import urllib.request

    deadline = time.monotonic() + SCRAPE_TIMEOUT_S
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=SCRAPE_TIMEOUT_S) as reply:
            text = reply.read().decode()
    except OSError:
        return None
    return text if time.monotonic() <= deadline else None


def test_scrapes_are_answered_while_idle_connections_outnumber_the_metrics_slots(synthetic_data):
    if not raise_own_nofile(256 + 256):
        pytest.skip("this test holds 320 sockets; the hard RLIMIT_NOFILE here is lower")
    metrics_port = free_port()
    config = DaemonConfig(
        data=str(synthetic_data.coco_json), imgsz=IMGSZ, workers=1, processes=1, metrics_port=metrics_port
    )
    with daemon_process(config) as (proc, _), IdleFlood() as flood:
        for idle in (64, 256):
            flood.open("127.0.0.1", metrics_port, idle - len(flood.sockets), source="127.0.0.2")
            for i in range(3):
                text = _scrape(metrics_port)
                assert text is not None, f"scrape {i + 1} of 3 unanswered within {SCRAPE_TIMEOUT_S:g} s ({idle} idle)"
                assert re.search(r"^pixpool_snapshot_bytes", text, re.MULTILINE), text[:300]
        assert proc.is_alive(), f"the daemon exited with code {proc.exitcode} under the flood"
