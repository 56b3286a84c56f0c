"""Everything a client sends is bounded: fields checked at decode, status replies bounded, a
probe whose cost does not grow with sessions, and a per-client session quota.

Integration test (spawned daemon, real route, synthetic snapshot at imgsz 160; raw
protocol peers over ipc and loopback TCP+CURVE on a random port).
"""

from __future__ import annotations

import os
import shutil

import pytest
import zmq
import zmq.auth

from helpers.daemon import WAIT_S, ask_status, free_port, real_daemon
from helpers.wire import raw_frame
from pixpool.cli import main
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
from pixpool.shared.transport import endpoint as ep
from pixpool.shared.transport.endpoint import write_keys
from pixpool.shared.wire.trainer import MAX_HOST_CHARS, decode, encode, encode_reply

IMGSZ = 160


def _attach_frame(host: str = "bounds") -> bytes:
    settings = StreamSettings(seed=1, batch_size=1, augment=AugmentConfig(imgsz=IMGSZ))
    # Unchecked: some tests send host names over the limit, which ``encode`` would not send.
    return raw_frame("attach", settings=settings.to_dict(), pid=os.getpid(), host=host, slots=2, delivery="frames")


def _ask(sock: zmq.Socket, frame: bytes) -> dict:
    sock.send(frame)
    assert sock.poll(WAIT_S * 1000), "no reply from the daemon"
    return decode(sock.recv_multipart()[0], reply=True)


@pytest.fixture
def peers():
    """``peers(endpoint, keys_dir=None)``: DEALER sockets (CURVE with a keys dir), closed after the test."""
    made: list[zmq.Socket] = []

    def make(endpoint: str, keys_dir=None) -> zmq.Socket:
        s = zmq.Context.instance().socket(zmq.DEALER)
        made.append(s)
        s.setsockopt(zmq.LINGER, 0)
        if keys_dir is not None:
            ep.configure_client(s, keys_dir)
        s.connect(endpoint)
        return s

    yield make
    for s in made:
        s.close(linger=0)


def test_bad_fields_get_field_errors_not_internal(synthetic_data, peers):
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1) as (proc, d):
        sock = peers(f"ipc://{d}/daemon.sock")
        for frame, field in [
            (raw_frame("records", start=0, split=3), "split"),
            (raw_frame("records", start=0, split=["train"]), "split"),  # was `internal` and a traceback per request
            (raw_frame("records", start=0, split="nope"), "split"),
            (raw_frame("records", start=-1), "start"),
            (_attach_frame(host="h" * 60_000), "host"),
            (
                raw_frame("attach", settings={}, pid=1, host="x", slots=2, delivery="shm", pid_ns="p" * 1000),
                "pid_ns",
            ),
            (raw_frame("heartbeat", trainer_id=1, token=1, data_wait_s="soon"), "data_wait_s"),
            (raw_frame("prove", trainer_id=1, token=1, nonce="n" * 5000), "nonce"),
        ]:
            reply = _ask(sock, frame)
            assert reply["op"] == "error" and reply["code"] == "protocol" and reply["field"] == field, (field, reply)
            assert field in reply["message"], reply
        assert ask_status(d)["trainers"] == [] and proc.is_alive()


def test_status_stays_bounded_and_the_probe_is_cheap_with_64_sessions(synthetic_data, peers, capsys):
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1, max_trainers_per_client=64) as (proc, d):
        sock = peers(f"ipc://{d}/daemon.sock")
        refused = [_ask(sock, _attach_frame(host=f"{i:03d}" + "h" * 60_000)) for i in range(64)]
        assert {(r["op"], r["field"]) for r in refused} == {("error", "host")}
        attached = [_ask(sock, _attach_frame(host=f"{i:03d}" + "h" * (MAX_HOST_CHARS - 3))) for i in range(64)]
        assert [r["op"] for r in attached] == ["attached"] * 64
        st = ask_status(d, timeout_s=10.0)
        assert st is not None and len(st["trainers"]) == st["daemon"]["trainers_total"] == 64
        assert main(["status", "--socket-dir", d]) == 0
        assert main(["status", "--probe", "--socket-dir", d]) == 0
        out = capsys.readouterr().out
        assert "healthy: 64 trainers" in out, out
        health = _ask(sock, encode("health"))
        assert health["op"] == "health" and health["healthy"] is True and health["trainers"] == 64
        assert len(encode_reply("health", **{k: v for k, v in health.items() if k not in ("v", "op")})) < 200


def test_one_client_cannot_take_every_session(synthetic_data, tmp_path, peers):
    keys = tmp_path / "keys"
    write_keys(keys)
    other = tmp_path / "other"  # a second authorized client key, same server
    write_keys(other)
    shutil.copy(keys / "server.key", other / "server.key")
    shutil.copy(keys / "server.key_secret", other / "server.key_secret")
    shutil.copy(other / "client.key", keys / "authorized" / "other.key")
    port = free_port()
    with real_daemon(
        synthetic_data.coco_json,
        imgsz=IMGSZ,
        workers=1,
        tcp=f"127.0.0.1:{port}",
        keys_dir=str(keys),
        max_trainers_per_client=2,
    ) as (_, d):
        local = peers(f"ipc://{d}/daemon.sock")
        assert [_ask(local, _attach_frame())["op"] for _ in range(2)] == ["attached", "attached"]
        third = _ask(local, _attach_frame())
        assert third["op"] == "error" and third["code"] == "capacity", third
        assert f"uid {os.getuid()}" in third["message"] and "max_trainers_per_client" in third["message"], third
        tcp = f"tcp://127.0.0.1:{port}"
        a = peers(tcp, keys)
        assert [_ask(a, _attach_frame())["op"] for _ in range(2)] == ["attached", "attached"]
        refused = _ask(a, _attach_frame())
        public = zmq.auth.load_certificate(str(keys / "client.key"))[0].decode()
        assert refused["code"] == "capacity" and public in refused["message"], refused
        b = peers(tcp, other)
        assert _ask(b, _attach_frame())["op"] == "attached", "another key was starved by the first one's sessions"
        assert len(ask_status(d)["trainers"]) == 5


def test_records_come_packed_or_as_lists_alike(synthetic_data, peers):
    # A trainer of this release asks ``packed`` (one byte string per reply); one of an earlier
    # release asks without it and gets lists of names: both name the same files in order.
    from pixpool.server.readers import load_dataset
    from pixpool.shared.stream.path_table import PathTable

    want = [r.image_path for r in load_dataset(synthetic_data.coco_json).records]
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1) as (_, d):
        sock = peers(f"ipc://{d}/daemon.sock")
        listed = _ask(sock, raw_frame("records", start=0))
        assert listed["files"] == want and listed["total"] == len(want) and "packed" not in listed
        packed = _ask(sock, raw_frame("records", start=0, packed=True))
        assert packed["files"] == [] and packed["count"] == len(want)
        assert PathTable.from_packed(packed["packed"]).tolist() == want
        tail = _ask(sock, raw_frame("records", start=len(want) - 1, packed=True))
        assert tail["count"] == 1 and PathTable.from_packed(tail["packed"]).tolist() == want[-1:]
        assert _ask(sock, raw_frame("records", start=0, packed="yes"))["field"] == "packed"
