"""One message cannot take the daemon's memory: a message of too many frames, or of frames
over the wire limit, is dropped without being kept, over ipc and over TCP+CURVE.

Integration test (spawned daemon, real route, synthetic snapshot at imgsz 160, loopback TCP
on a random port). The daemon's RSS is read with psutil before and after each attack.

Tolerance: before the fix, 200 frames of 1 MB grew the daemon by about twice their size
(libzmq's queue, then a Python copy of every frame, kept by the allocator). Now such a peer
is dropped at its first frame, and a message of 1,000 frames of 60 KB (60 MB, each frame
under the limit) is answered with a ``protocol`` error after libzmq's queue of it was freed
and given back; 32 MiB of growth is half the smaller attack.
"""

from __future__ import annotations

import psutil
import pytest
import zmq

from helpers.daemon import WAIT_S, free_port, real_daemon
from pixpool.client import Client
from pixpool.client.options import ClientOptions
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
from pixpool.shared.transport import endpoint as ep
from pixpool.shared.transport.endpoint import write_keys
from pixpool.shared.wire.trainer import decode, encode

IMGSZ = 160
GROWTH_LIMIT_BYTES = 32 << 20


def _rss(pid: int) -> int:
    return psutil.Process(pid).memory_info().rss


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_oversized_messages_leave_the_daemon_bounded_and_serving(synthetic_data, tmp_path, transport):
    keys = tmp_path / "keys"
    write_keys(keys)
    port = free_port()
    made: list[zmq.Socket] = []

    def peer(endpoint: str) -> zmq.Socket:
        s = zmq.Context.instance().socket(zmq.DEALER)
        made.append(s)
        s.setsockopt(zmq.LINGER, 0)
        if endpoint.startswith("tcp://"):
            ep.configure_client(s, keys)
        s.connect(endpoint)
        return s

    tcp = f"127.0.0.1:{port}"
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1, tcp=tcp, keys_dir=str(keys)) as (proc, d):
        endpoint = f"ipc://{d}/daemon.sock" if transport == "ipc" else f"tcp://127.0.0.1:{port}"
        try:
            probe = peer(endpoint)  # the connection works (CURVE handshake done) before measuring
            probe.send(encode("status"))
            assert probe.poll(WAIT_S * 1000)
            probe.recv()
            before = _rss(proc.pid)

            # Frames of 1 MB each, 200 of them: over the per-frame limit.
            big = peer(endpoint)
            chunk = b"\x01" * 1_000_000
            for _ in range(199):
                big.send(chunk, zmq.SNDMORE)
            big.send(chunk)
            assert not big.poll(2000), "a message of 1 MB frames was answered: the daemon read it"

            # 1,000 frames of 60 KB each: every frame under the limit, the message far over.
            many = peer(endpoint)
            many.send_multipart([b"\x02" * (60 * 1024)] * 1000)
            assert many.poll(WAIT_S * 1000), "no reply to a message of 1000 frames"
            msg = decode(many.recv(), reply=True)
            assert msg["op"] == "error" and msg["code"] == "protocol" and "got 1000" in msg["message"], msg

            probe.send(encode("status"))
            assert probe.poll(WAIT_S * 1000)
            probe.recv()
            growth = _rss(proc.pid) - before
            assert growth < GROWTH_LIMIT_BYTES, f"daemon RSS grew by {growth} bytes after the oversized messages"
        finally:
            for s in made:
                s.close(linger=0)
        assert proc.is_alive()
        s = StreamSettings(seed=3, batch_size=4, augment=AugmentConfig(imgsz=IMGSZ))
        client_args = {"socket_dir": d} if transport == "ipc" else {"endpoint": endpoint, "keys_dir": keys}
        with Client.connect(s, ClientOptions(timeout_s=WAIT_S, **client_args)) as c:
            it = c.epoch(0)
            assert next(it).images.shape[0] == 4
            it.close()
