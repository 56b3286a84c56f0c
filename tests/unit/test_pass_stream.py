"""``PassStreams``: a split attached afresh for each pass (validation) waits for a restarting
daemon as the training stream does, and stays on the snapshot its first pass read.

Unit tests: stand-in streams that say which snapshot they attached to; no daemon, no process.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from pixpool.client.options import ClientOptions
from pixpool.client.pass_stream import PassStreams
from pixpool.shared.errors import SnapshotChangedError
from pixpool.shared.task import DETECT


class _Stream:
    """What ``PassStreams`` reads of an attachment: its client's snapshot and endpoint, close()."""

    def __init__(self, fingerprint: str, records: int = 24):
        snapshot = {"fingerprint": fingerprint, "name": f"snap-{fingerprint}", "records": records, "names": ["a", "b"]}
        self.client = SimpleNamespace(snapshot=snapshot, endpoint="ipc:///tmp/d/daemon.sock", num_records=records)
        self.spec = DETECT
        self.closed = False

    def close(self) -> None:
        self.closed = True


def _opener(fingerprints: list[str]):
    opened: list[tuple[float, _Stream]] = []
    pending = iter(fingerprints)

    def open_stream(wait_s: float) -> _Stream:
        stream = _Stream(next(pending))
        opened.append((wait_s, stream))
        return stream

    return open_stream, opened


def test_a_later_pass_waits_for_a_restart_and_must_find_the_first_snapshot():
    open_stream, opened = _opener(["a" * 64, "a" * 64, "b" * 64])
    passes = PassStreams(open_stream, ClientOptions(wait_s=0.0, timeout_s=120.0))
    passes.open().close()
    passes.open().close()
    with pytest.raises(SnapshotChangedError) as err:
        passes.open(what="validation pass after epoch 3")
    # The first pass waits the run's wait_s; later ones as long as the training stream waits for a restart.
    assert [wait for wait, _ in opened] == [0.0, 120.0, 120.0]
    assert opened[-1][1].closed, "the refused pass stays attached"
    text = str(err.value)
    for part in ("a" * 16, "b" * 16, "val split", "validation pass after epoch 3", "follow_snapshot"):
        assert part in text, f"{part!r} missing from: {text}"
    assert err.value.before["fingerprint"] == "a" * 64 and err.value.after["fingerprint"] == "b" * 64


def test_a_run_that_waits_longer_than_its_timeout_waits_that_long_for_a_restart():
    open_stream, opened = _opener(["a" * 64, "a" * 64])
    passes = PassStreams(open_stream, ClientOptions(wait_s=300.0, timeout_s=120.0))
    passes.open()
    passes.open()
    assert [wait for wait, _ in opened] == [300.0, 300.0]


def test_follow_snapshot_goes_on_with_the_new_snapshot_and_says_so(caplog):
    open_stream, opened = _opener(["a" * 64, "b" * 64, "b" * 64])
    passes = PassStreams(open_stream, ClientOptions(wait_s=0.0, timeout_s=60.0, follow_snapshot=True))
    passes.open()
    with caplog.at_level(logging.WARNING, logger="pixpool.client.pass_stream"):
        assert passes.open() is opened[1][1]
    assert "following the daemon onto another snapshot" in caplog.text
    assert passes.pinned["fingerprint"] == "b" * 64
    passes.open()  # pinned to the new one now


def test_the_ultralytics_validation_loader_refuses_a_pass_on_another_snapshot():
    """``ValLoader`` (Ultralytics' validation dataloader) attaches per pass through ``PassStreams``."""
    from pixpool.integrations.ultralytics.val_loader import ValLoader

    fingerprints = iter(["a" * 64, "c" * 64])
    waits = []

    def open_stream(wait_s: float):
        waits.append(wait_s)
        stream = _Stream(next(fingerprints), records=3)
        stream.client.files = ["x.jpg", "y.jpg", "z.jpg"]
        stream.settings = SimpleNamespace(batch_size=2)
        stream.names = ["a", "b"]
        return stream

    loader = ValLoader(open_stream, restart_wait_s=90.0)
    assert loader.num_records == 3
    with pytest.raises(SnapshotChangedError, match="another snapshot of its val split"):
        next(iter(loader))
    assert waits == [0.0, 90.0]
