"""``attach()`` ships nothing per record: the records' file names come when first read.

Integration tests: a spawned daemon serving two synthetic sets of different sizes, the small
one as its train split and one ten times larger as its val split, so one daemon answers an
attach for each size; raw protocol peers for the ``attached`` reply's size, ``attach()`` for
what a user reads (``loader.files``, a batch's ``files``), and a fresh interpreter for what
``attach()`` imports.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import zmq

from helpers.daemon import WAIT_S, real_daemon
from pixpool.client import attach
from pixpool.server.readers import load_dataset
from pixpool.server.synthetic import write_synthetic
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
from pixpool.shared.wire.trainer import decode, encode

IMGSZ = 64
SMALL, LARGE = 24, 240


@pytest.fixture(scope="module")
def two_sizes(tmp_path_factory):
    """(small, large): synthetic sets of SMALL and LARGE images, in folders of equal-length names
    (the ``attached`` reply names the served data's path)."""
    root = tmp_path_factory.mktemp("sizes")
    return write_synthetic(root / "small", num_images=SMALL), write_synthetic(root / "large", num_images=LARGE)


@pytest.fixture(scope="module")
def served(two_sizes):
    """A daemon whose train split is the small set and val split the large one: its socket dir."""
    small, large = two_sizes
    with real_daemon(small.coco_json, imgsz=IMGSZ, workers=1, val=str(large.coco_json)) as (_, d):
        yield d


def _attached_reply(socket_dir: str, split: str) -> bytes:
    """The raw ``attached`` frame of one attach to ``split`` (the session detached after)."""
    settings = StreamSettings(seed=0, batch_size=4, split=split, augment=AugmentConfig(imgsz=IMGSZ))
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(f"ipc://{socket_dir}/daemon.sock")
        sock.send(
            encode("attach", settings=settings.to_dict(), pid=os.getpid(), host="lazy", slots=2, delivery="frames")
        )
        assert sock.poll(WAIT_S * 1000), "no reply to attach"
        frame = sock.recv_multipart()[0]
        msg = decode(frame, reply=True)
        assert msg["op"] == "attached", msg
        sock.send(encode("detach", trainer_id=msg["trainer_id"], token=msg["token"]))
        assert sock.poll(WAIT_S * 1000), "no reply to detach"
        return frame
    finally:
        sock.close(linger=0)


def test_the_attached_reply_does_not_grow_with_the_records(served, two_sizes):
    small, large = two_sizes
    names = [len(r.image_path.encode()) for r in load_dataset(large.coco_json).records]
    assert sum(names) > 10_000  # what 240 names would add to a reply that carried them
    got = {split: len(_attached_reply(served, split)) for split in ("train", "val")}
    # Ten times the records: a few bytes more at most (the count, the paths' spelling, the token).
    assert abs(got["val"] - got["train"]) < 200, got


def test_attach_fetches_no_name_until_one_is_read(served, two_sizes, monkeypatch):
    from pixpool.client import client as client_module

    small, large = two_sizes
    fetches = []
    real_fetch = client_module.fetch_files

    def counted(*args, **kwargs):
        fetches.append(kwargs.get("split"))
        return real_fetch(*args, **kwargs)

    monkeypatch.setattr(client_module, "fetch_files", counted)
    for split, data in (("train", small), ("val", large)):
        want = [r.image_path for r in load_dataset(data.coco_json).records]
        fetches.clear()
        with attach(served, batch_size=8, seed=1, imgsz=IMGSZ, split=split, timeout_s=WAIT_S) as loader:
            assert fetches == [] and not loader.files.fetched, f"{split}: attach fetched the records' names"
            assert len(loader) == -(-len(want) // 8) and fetches == []  # the count came with the attach
            assert loader.files[len(want) - 1] == want[-1] and fetches == [split]
            assert len(loader.files) == len(want)
            assert list(loader.files) == want and loader.files[2:5] == want[2:5]
            batches = list(loader)
            assert fetches == [split], "the names were fetched more than once"
        # The split's own names (a val stream once got the train split's), each batch its records'.
        assert sorted(i for b in batches for i in b.indices.tolist()) == list(range(len(want)))
        assert all(b.files == [want[i] for i in b.indices.tolist()] for b in batches)


def test_names_first_read_by_a_batch_and_kept_after_close(served, two_sizes):
    small, _ = two_sizes
    want = [r.image_path for r in load_dataset(small.coco_json).records]
    with attach(served, batch_size=8, seed=2, imgsz=IMGSZ, timeout_s=WAIT_S) as loader:
        first = next(iter(loader))
        assert first.files == [want[i] for i in first.indices.tolist()] and loader.files.fetched
    assert list(loader.files) == want  # fetched while attached: still there after close


def test_names_asked_only_after_close_say_so(served):
    from pixpool.shared.errors import ClosedError

    with attach(served, batch_size=8, imgsz=IMGSZ, timeout_s=WAIT_S) as loader:
        pass
    with pytest.raises(ClosedError, match="closed before its records' file names were read"):
        loader.files[0]


_FRESH = """
import sys
import pixpool.client
loader = pixpool.client.attach(sys.argv[1], batch_size=8, imgsz=int(sys.argv[2]), timeout_s=60)
imported_at_attach = "torch" in sys.modules
images, targets = next(iter(loader))
loader.close()
print(imported_at_attach, type(images).__module__)
"""


def test_attach_leaves_the_torch_import_to_the_first_batch(served):
    # torch's import took seconds inside attach() (2.09 s of a 100k-record attach was that):
    # a script that has not imported torch yet gets its loader at once, its first batch as tensors.
    done = subprocess.run(
        [sys.executable, "-c", _FRESH, served, str(IMGSZ)], capture_output=True, text=True, timeout=WAIT_S * 2
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "torch"], done.stdout
