"""Keep serving through sweeps: ``clean`` never removes what a live daemon holds, and a
daemon whose segment disappears anyway (``rm``) notices, says so and never serves half."""

from __future__ import annotations

import os

import pytest

from helpers.daemon import WAIT_S, ask_status, digest_of, real_daemon, reference_stream, wait_for
from pixpool.cli import main
from pixpool.client import Client
from pixpool.client.options import ClientOptions
from pixpool.server.readers import load_dataset
from pixpool.shared.errors import DaemonStopped
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
from pixpool.shared.transport.store import DEFAULT

IMGSZ = 96


def _settings() -> StreamSettings:
    return StreamSettings(seed=5, batch_size=4, augment=AugmentConfig(imgsz=IMGSZ))


def test_clean_all_keeps_a_live_daemons_segments_and_names_the_holder(synthetic_data, capsys):
    dataset = load_dataset(synthetic_data.coco_json)
    s = _settings()
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1) as (proc, d):
        with Client.connect(s, ClientOptions(socket_dir=d, timeout_s=WAIT_S)) as c:
            it = c.epoch(0)
            got = [digest_of(next(it))]
            segments = [*ask_status(d)["snapshot"]["segments"], c._ring.name]
            # Named, so that the sweep touches nothing else of this machine's; --all on top.
            assert main(["clean", "--all", *segments]) == 0
            out = capsys.readouterr().out
            assert all(os.path.exists(DEFAULT.path(n)) for n in segments), out
            assert "removed" not in out and f"in use by pid {proc.pid}" in out
            got += [digest_of(b) for b in it]
        assert got == reference_stream(dataset, s, 0)[0]


def test_daemon_stops_cleanly_when_its_snapshot_is_removed(synthetic_data):
    s = _settings()
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1) as (proc, d):
        snapshot = ask_status(d)["snapshot"]["segments"]
        with Client.connect(s, ClientOptions(socket_dir=d, timeout_s=WAIT_S)) as c:
            it = c.epoch(0)
            next(it)
            ring = c._ring.name
            os.unlink(DEFAULT.path(snapshot[1]))  # what an `rm /dev/shm/pixpool*` does
            with pytest.raises(DaemonStopped, match="removed from /dev/shm"):
                for _ in range(100):  # the daemon checks within a fraction of a second
                    for _ in c.epoch(0):
                        pass
        proc.join(WAIT_S)
        assert proc.exitcode not in (0, None), "a daemon that lost its snapshot must exit non-zero"
        assert not any(os.path.exists(DEFAULT.path(n)) for n in [*snapshot, ring]), (
            "the stopped daemon left segments behind"
        )


def test_a_removed_ring_is_rebuilt_and_the_stream_goes_on(synthetic_data):
    dataset = load_dataset(synthetic_data.coco_json)
    s = _settings()
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1) as (proc, d):
        with Client.connect(s, ClientOptions(socket_dir=d, timeout_s=WAIT_S, slots=2)) as c:
            it = c.epoch(0)
            got = [digest_of(next(it))]
            old = c._ring.name
            os.unlink(DEFAULT.path(old))
            wait_for(
                lambda: not ask_status(d)["trainers"], 15, "daemon noticed the removed ring and detached its trainer"
            )
            got += [digest_of(b) for b in it]
            assert c.reattaches == 1 and c._ring.name != old
            assert os.path.exists(DEFAULT.path(c._ring.name))
        assert got == reference_stream(dataset, s, 0)[0]


def test_a_serving_daemon_sweeps_a_killed_writers_temporary_file(synthetic_data):
    """A temporary file nobody holds (a writer killed before publishing) goes with the
    periodic sweep, while the daemon serves; one a live writer holds stays."""
    from pixpool.server.daemon.sweeps import SWEEP_EVERY_S
    from pixpool.shared.transport import holds
    from pixpool.shared.transport.names import temporary_name

    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1) as (proc, d):
        base = ask_status(d)["snapshot"]["segments"][0]
        dead, live = DEFAULT.path(temporary_name(base)), DEFAULT.path(temporary_name(base))
        for path in (dead, live):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        fd = os.open(live, os.O_RDWR)
        try:
            assert holds.hold(fd, (holds.CREATOR,))
            wait_for(lambda: not os.path.exists(dead), SWEEP_EVERY_S * 3, "the daemon swept the unheld temporary file")
            assert os.path.exists(live), "a temporary file its writer still holds was removed"
            assert proc.is_alive()
        finally:
            os.close(fd)
            os.unlink(live)
