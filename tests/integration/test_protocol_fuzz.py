"""Fuzz the daemon's socket: thousands of random, mutated, oversized and out-of-order frames,
then a normal trainer still receives a correct stream.

Integration test (spawned daemon, real route, synthetic snapshot at imgsz 160). Bounded in
count (3000 frames) and time (each phase has a deadline).
"""

from __future__ import annotations

import os
import pickle
import random
import time

import msgpack

from helpers.daemon import WAIT_S, ask_status, digest_of, real_daemon, reference_stream
from helpers.wire import raw_frame
from pixpool.client import Client
from pixpool.client.options import ClientOptions
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
from pixpool.shared.wire.trainer import MAX_FRAME_BYTES, MAX_WIRE_BYTES, PROTOCOL_VERSION, REQUEST_OPS, decode, encode

IMGSZ = 160
FRAMES = 3000


def _settings(seed=21, batch_size=4):
    return StreamSettings(seed=seed, batch_size=batch_size, augment=AugmentConfig(imgsz=IMGSZ))


def _random_obj(rng: random.Random, depth: int = 0):
    kind = rng.randrange(8 if depth < 3 else 5)
    if kind == 0:
        return rng.randrange(-(1 << 63), 1 << 64) if rng.random() < 0.1 else rng.randrange(-5, 100)
    if kind == 1:
        return rng.random()
    if kind == 2:
        return "".join(rng.choice("abcdefv op_") for _ in range(rng.randrange(8)))
    if kind == 3:
        return rng.randbytes(rng.randrange(16))
    if kind == 4:
        return rng.choice([None, True, False])
    if kind == 5:
        return [_random_obj(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == 6:
        return msgpack.ExtType(rng.randrange(128), rng.randbytes(4))
    return {
        rng.choice(["v", "op", "slot", "trainer_id", "token", "settings", "epoch", "x"]): _random_obj(rng, depth + 1)
        for _ in range(rng.randrange(5))
    }


def _mutate(rng: random.Random, frame: bytes) -> bytes:
    b = bytearray(frame)
    for _ in range(rng.randrange(1, 4)):
        choice = rng.randrange(4)
        if choice == 0 and b:
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        elif choice == 1 and b:
            del b[rng.randrange(len(b)) :]
        elif choice == 2:
            b.insert(rng.randrange(len(b) + 1), rng.randrange(256))
        else:
            b += rng.randbytes(rng.randrange(1, 8))
    return bytes(b)


def _frames(rng: random.Random, tid: int, token: int):
    ok_attach = encode("attach", settings=_settings(5).to_dict(), pid=os.getpid(), host="fuzz", slots=2, delivery="shm")
    valid = [
        ok_attach,
        encode("release", trainer_id=tid, token=token, slot=0, epoch=0, batch=0, generation=1),
        encode("start", trainer_id=tid, token=token, epoch=0, batch=0),
        encode("heartbeat", trainer_id=tid, token=token),
        encode("status"),
        encode("detach", trainer_id=tid + 1000, token=token),
    ]
    for k in range(FRAMES):
        kind = k % 10
        if kind < 4:
            yield [_mutate(rng, rng.choice(valid))]
        elif kind == 4:
            yield [rng.randbytes(rng.randrange(0, 300))]
        elif kind == 5:
            yield [msgpack.packb(_random_obj(rng))]
        elif kind == 6:
            msg = {"v": PROTOCOL_VERSION, "op": rng.choice(sorted(REQUEST_OPS) + ["ready", "error", "zz"])}
            msg.update(
                {
                    k: _random_obj(rng)
                    for k in rng.sample(
                        [
                            "trainer_id",
                            "token",
                            "slot",
                            "epoch",
                            "batch",
                            "generation",
                            "settings",
                            "pid",
                            "host",
                            "slots",
                            "delivery",
                        ],
                        4,
                    )
                }
            )
            yield [msgpack.packb(msg)]
        elif kind == 7:  # out of order: releases of slots never announced, starts beyond the epoch
            yield [
                rng.choice(
                    [
                        raw_frame(
                            "release",
                            trainer_id=tid,
                            token=token,
                            slot=rng.randrange(-3, 70),
                            epoch=0,
                            batch=0,
                            generation=1,
                        ),
                        raw_frame(  # negative positions: encode would not send them, a peer may
                            "start",
                            trainer_id=tid,
                            token=token,
                            epoch=rng.randrange(-2, 3),
                            batch=rng.randrange(-2, 50),
                        ),
                        encode("release", trainer_id=tid, token=token + 1, slot=0, epoch=0, batch=0, generation=1),
                    ]
                )
            ]
        elif kind == 8:
            yield [
                rng.choice(
                    [
                        msgpack.packb({"v": 99, "op": "status"}),
                        b"\x00" * (MAX_FRAME_BYTES + rng.randrange(1, 5000)),
                        pickle.dumps({"op": "status"}),
                    ]
                )
            ]
        else:
            yield [encode("status")] * rng.randrange(2, 4) if rng.random() < 0.5 else [b""] * rng.randrange(2, 5)


def _count_error_replies(sock) -> int:
    """Read every reply waiting on ``sock``; how many are ``error`` replies."""
    errors = 0
    while sock.poll(0):
        msg = sock.recv_multipart()
        try:
            errors += decode(msg[0], reply=True)["op"] == "error"
        except Exception:  # a reply this test cannot parse is simply not an error reply
            pass
    return errors


def test_daemon_survives_fuzz_and_serves_correct_stream(synthetic_data, tmp_path, dealer):
    from pixpool.server.readers import load_dataset

    rng = random.Random(1234)
    with real_daemon(
        synthetic_data.coco_json, imgsz=IMGSZ, workers=1, heartbeat_timeout_s=3.0, max_ring_nbytes=64 << 20
    ) as (proc, d):
        sock = dealer(f"ipc://{d}/daemon.sock", RCVHWM=100000)
        sock.send(
            encode("attach", settings=_settings(6).to_dict(), pid=os.getpid(), host="fuzz", slots=2, delivery="shm")
        )
        assert sock.poll(WAIT_S * 1000)
        att = decode(sock.recv(), reply=True)
        tid, token = att["trainer_id"], att["token"]
        sent, errors = 0, 0
        deadline = time.monotonic() + 60
        for frames in _frames(rng, tid, token):
            sock.send_multipart(frames)
            sent += 1
            errors += _count_error_replies(sock)
            assert time.monotonic() < deadline, "fuzzing took too long"
        # Every frame gets at most one reply; each malformed one an error. Collect the rest.
        end = time.monotonic() + 20
        while time.monotonic() < end and sock.poll(500):
            errors += _count_error_replies(sock)
        sock.close(linger=0)
        assert sent == FRAMES
        assert errors > FRAMES // 2, f"only {errors} error replies to {FRAMES} mostly malformed frames"
        assert proc.is_alive()
        st = ask_status(d)
        assert st is not None and st["daemon"]["pid"] == proc.pid
        s = _settings(22)
        with Client.connect(s, ClientOptions(socket_dir=d, timeout_s=WAIT_S)) as c:
            got = [digest_of(b) for b in c.epoch(0)]
        assert got == reference_stream(load_dataset(synthetic_data.coco_json), s, 0)[0]


def test_huge_frame_drops_only_that_peer(synthetic_data, dealer):
    """A frame over MAX_WIRE_BYTES is refused by libzmq before it is allocated; others are served."""

    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1) as (proc, d):
        sock = dealer(f"ipc://{d}/daemon.sock")
        sock.send(b"\x00" * (MAX_WIRE_BYTES + 1))
        assert not sock.poll(500), "no reply: the daemon never reads such a frame"
        assert ask_status(d)["daemon"]["pid"] and proc.is_alive()
        with Client.connect(_settings(2), ClientOptions(socket_dir=d, timeout_s=WAIT_S)) as c:
            it = c.epoch(0)
            assert next(it).images.shape[0] > 0
            it.close()
