"""Rect validation batches (``rect_stride``) keep the route's contract: the daemon's bytes, with
its workers splitting each batch into parts, equal the in-process reference path's, batch by
batch, on the val split; and every image lands in a batch of the plan's shape."""

from __future__ import annotations

import pytest

from helpers.daemon import WAIT_S, digest_of, real_daemon, reference_stream
from pixpool.client import Client
from pixpool.client.options import ClientOptions
from pixpool.server.readers import load_dataset
from pixpool.shared.stream.config import AugmentConfig, StreamSettings

IMGSZ = 96


@pytest.mark.parametrize("workers", [1, 2])
def test_rect_val_batches_equal_the_reference_path(synthetic_data, workers):
    settings = StreamSettings(
        split="val",
        batch_size=5,
        shuffle=False,
        augment=AugmentConfig(imgsz=IMGSZ, train_route=False, rect_stride=32),
    )
    dataset = load_dataset(synthetic_data.data_yaml, split="val")
    with real_daemon(synthetic_data.data_yaml, imgsz=IMGSZ, workers=workers) as (_, d):
        with Client.connect(settings, ClientOptions(socket_dir=d, timeout_s=WAIT_S)) as c:
            got, samples = [], []
            for b in c.epoch(0):
                got.append(digest_of(b))
                samples.append(b.samples.tolist())
    want, want_samples = reference_stream(dataset, settings, 0)
    assert samples == want_samples and len(got) >= 2
    assert got == want


def test_the_daemon_sends_each_records_decoded_size_with_its_name(synthetic_data):
    """``loader.files.sizes()``: the val split's decoded (height, width) per record, as the
    image files are (what rect batches are planned from), fetched with the names, no file read."""
    from PIL import Image

    import pixpool.client as pc

    with real_daemon(synthetic_data.data_yaml, imgsz=IMGSZ, workers=1) as (_, d):
        with pc.attach(d, split="val", batch_size=4, train_route=False, shuffle=False, timeout_s=WAIT_S) as loader:
            sizes = loader.files.sizes()
            files = list(loader.files)
    assert sizes is not None and sizes.shape == (len(files), 2)
    for (h, w), path in zip(sizes.tolist(), files):
        with Image.open(path) as im:
            assert (h, w) == (im.size[1], im.size[0]), path
