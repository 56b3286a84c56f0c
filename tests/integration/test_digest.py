"""``pixpool digest``: the snapshot path and the reference path print the same digests."""

from __future__ import annotations

import json
import os

import pytest

from pixpool.cli import main
from pixpool.shared.transport.store import DEFAULT

# A small stream: 64 px, batches of 2, one decoder, no mosaic.
_TINY = ["--batch-size", "2", "--imgsz", "64", "--processes", "1", "--mosaic", "0"]


def _digest(capsys, *argv: str) -> dict:
    assert main(["digest", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("dtype", ["uint8", "float32"])  # the default, and the other one
def test_snapshot_and_reference_digests_agree(synthetic_data, capsys, dtype) -> None:
    before = set(DEFAULT.segments())
    flags = [
        str(synthetic_data.coco_json),
        "--seed",
        "4",
        "--epoch",
        "1",
        "--batches",
        "2",
        "--batch-size",
        "4",
        "--imgsz",
        "96",
        "--in-process",
        "--processes",
        "1",
        "--dtype",
        dtype,
        "--copy-paste",
        "0.5",
        "--mixup",
        "0.3",
    ]
    snap = _digest(capsys, *flags)
    ref = _digest(capsys, *flags, "--reference")
    assert snap["path"] == "snapshot" and ref["path"] == "reference"
    assert len(snap["digests"]) == 2 and snap["digests"] == ref["digests"]
    assert set(DEFAULT.segments()) == before, "a snapshot the command prepared is removed at exit"
    other = _digest(capsys, *flags[:-2], "--reference")  # mixup off changes the stream
    assert other["digests"] != ref["digests"]


def test_plain_output_and_keep_snapshot(synthetic_data, capsys) -> None:
    before = set(DEFAULT.segments())
    assert (
        main(
            [
                "digest",
                str(synthetic_data.data_yaml),
                "--batches",
                "1",
                *_TINY,
                "--keep-snapshot",
                "--in-process",
            ]
        )
        == 0
    )
    line = capsys.readouterr().out.strip().splitlines()
    assert len(line) == 1 and line[0].startswith("epoch 0 batch 0 ") and len(line[0].split()[-1]) == 64
    kept = set(DEFAULT.segments()) - before
    try:
        assert kept, "--keep-snapshot keeps what it prepared"
    finally:
        for name in kept:
            os.unlink(os.path.join("/dev/shm", name))


def test_bad_flags_name_the_field(synthetic_data, capsys) -> None:
    assert main(["digest", str(synthetic_data.coco_json), "--reference", "--mosaic", "2"]) == 1
    assert "'mosaic'" in capsys.readouterr().err
    assert main(["digest", str(synthetic_data.coco_json), "--reference", "--batches", "99", "--batch-size", "8"]) == 1
    assert "--batches 99 is out of range" in capsys.readouterr().err


@pytest.mark.parametrize("workers", [1, 3])
def test_daemon_path_equals_reference(synthetic_data, capsys, workers) -> None:
    """Without --reference or --in-process, digest starts a temporary daemon and hashes what a
    trainer receives: the same whether one worker renders a batch or three render a part each."""
    before = set(DEFAULT.segments())
    flags = [
        str(synthetic_data.coco_json),
        "--seed",
        "2",
        "--epoch",
        "0",
        "--batches",
        "3",
        "--batch-size",
        "4",
        "--imgsz",
        "96",
        "--copy-paste",
        "0.5",
    ]
    daemon = _digest(capsys, *flags, "--workers", str(workers))
    ref = _digest(capsys, *flags, "--reference")
    assert daemon["path"] == "daemon" and ref["path"] == "reference"
    assert len(daemon["digests"]) == 3 and daemon["digests"] == ref["digests"]
    assert set(DEFAULT.segments()) == before, "the temporary daemon removes its snapshot and rings"


def test_batches_without_targets_digest_on_every_path(synthetic_copy, capsys) -> None:
    """Background-only images: a batch whose packed targets are (0, 6) hashes like any other,
    rendered here, from a snapshot, and through a temporary daemon."""
    coco = synthetic_copy / "annotations" / next(p.name for p in (synthetic_copy / "annotations").iterdir())
    doc = json.loads(coco.read_text())
    doc["annotations"] = []
    coco.write_text(json.dumps(doc))
    before = set(DEFAULT.segments())
    flags = [
        str(coco),
        "--images",
        str(synthetic_copy / "images" / "train"),
        "--batches",
        "2",
        *_TINY,
    ]
    ref = _digest(capsys, *flags, "--reference")
    snap = _digest(capsys, *flags, "--in-process")
    daemon = _digest(capsys, *flags, "--workers", "1")
    assert len(ref["digests"]) == 2 and ref["digests"] == snap["digests"] == daemon["digests"]
    assert set(DEFAULT.segments()) == before
