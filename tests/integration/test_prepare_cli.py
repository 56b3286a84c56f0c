"""``pixpool prepare`` / ``ls`` / ``clean`` end to end: bad inputs, SIGKILL then clean."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.daemon import wait_for
from helpers.snapshot import created_by_me, remove_snapshot
from pixpool.cli import main
from pixpool.server.readers import load_dataset
from pixpool.server.snapshot.fingerprint import base_name, fingerprint
from pixpool.server.snapshot.handle import read_header
from pixpool.shared.transport.holds import holds_of
from pixpool.shared.transport.names import snapshot_base
from pixpool.shared.transport.names import snapshot_parts as parts_of_base
from pixpool.shared.transport.store import DEFAULT, Store


@pytest.fixture
def ds(synthetic_copy) -> Path:
    return synthetic_copy


def _json(ds: Path) -> Path:
    return ds / "annotations" / "instances_train.json"


def _missing_image(ds):
    (ds / "images" / "train" / "synth_0005.jpg").unlink()
    return [str(_json(ds))], "synth_0005.jpg"


def _corrupt_image(ds):
    (ds / "images" / "train" / "synth_0006.jpg").write_bytes(b"\xff\xd8 this is not a jpeg" * 10)
    return [str(_json(ds))], "synth_0006.jpg"


def _bad_json(ds):
    _json(ds).write_text('{"images": [')
    return [str(_json(ds))], "instances_train.json"


def _bad_label_line(ds):
    path = ds / "labels" / "train" / "synth_0004.txt"
    path.write_text(path.read_text() + "1 0.5 abc 0.1 0.1\n")
    return [str(ds / "data.yaml")], "synth_0004.txt:"


def _class_out_of_range(ds):
    path = ds / "labels" / "train" / "synth_0004.txt"
    path.write_text(path.read_text() + "8 0.5 0.5 0.1 0.1\n")
    return [str(ds / "data.yaml")], "synth_0004.txt:"


def _size_mismatch(ds):
    data = json.loads(_json(ds).read_text())
    data["images"][2]["width"] += 7  # the annotation no longer describes the image
    _json(ds).write_text(json.dumps(data))
    return [str(_json(ds))], data["images"][2]["file_name"]


def _truncated_jpeg(ds):
    path = ds / "images" / "train" / "synth_0003.jpg"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])  # the bottom of the image cut off
    return [str(_json(ds))], "synth_0003.jpg: the JPEG ends without its end-of-image marker"


def _png_bomb(ds):
    import struct
    import zlib

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    # A 60000x60000 header over a few bytes of data: Pillow's bomb guard, named by file.
    png = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", 60000, 60000, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(b"\0" * 16))
        + chunk(b"IEND", b"")
    )
    (ds / "images" / "train" / "synth_0002.jpg").write_bytes(png)
    return [str(_json(ds))], "synth_0002.jpg: the image header claims too many pixels"


def _deep_json(ds):
    _json(ds).write_text("[" * 100000 + "]" * 100000)
    return [str(_json(ds))], "instances_train.json: nested deeper than the json parser's limit"


def _runaway_label_file(ds):
    path = ds / "labels" / "train" / "synth_0004.txt"
    path.write_text("0 0.5 0.5 0.1 0.1\n" * 5000)
    return [str(ds / "data.yaml")], "synth_0004.txt:1001: more than 1000 instances for one image"


def _non_finite_bbox(value):
    def breaker(ds):
        data = json.loads(_json(ds).read_text())
        ann = data["annotations"][3]
        ann["bbox"][2] = value  # json writes NaN / Infinity, which Python's json reads back
        _json(ds).write_text(json.dumps(data))
        name = next(img["file_name"] for img in data["images"] if img["id"] == ann["image_id"])
        where = f"annotations[3] (id {ann['id']}, image id {ann['image_id']}, {name})"
        return [str(_json(ds))], f"{where}: bbox holds a number that is not finite"

    breaker.__name__ = f"_bbox_{value}"
    return breaker


def corrupt_jpeg_middle(path: Path) -> None:
    """Overwrite 1 KiB in the middle of the compressed data with 0xAA: markers at both ends
    intact, and OpenCV still decodes it (libjpeg only warns)."""
    import cv2

    data = bytearray(path.read_bytes())
    start = data.index(b"\xff\xda")  # start of scan
    mid = (start + len(data)) // 2
    data[mid : mid + 1024] = b"\xaa" * 1024
    path.write_bytes(bytes(data))
    assert data[:2] == b"\xff\xd8" and data[-2:] == b"\xff\xd9" and cv2.imread(str(path)) is not None


def _corrupt_jpeg_middle(ds):
    corrupt_jpeg_middle(ds / "images" / "train" / "synth_0003.jpg")
    return [str(_json(ds))], "synth_0003.jpg: the JPEG's compressed data is damaged (libjpeg: Corrupt JPEG data"


@pytest.mark.parametrize(
    "breaker",
    [
        _missing_image,
        _corrupt_image,
        _bad_json,
        _bad_label_line,
        _class_out_of_range,
        _size_mismatch,
        _truncated_jpeg,
        _png_bomb,
        _deep_json,
        _runaway_label_file,
        _non_finite_bbox(float("nan")),
        _non_finite_bbox(float("inf")),
        _corrupt_jpeg_middle,
    ],
)
def test_bad_input_exits_non_zero_names_file_and_leaves_shm_alone(ds, breaker, capsys):
    argv, name = breaker(ds)
    before = set(DEFAULT.segments())
    code = main(["prepare", *argv, "--imgsz", "96", "--processes", "1"])
    err = capsys.readouterr().err
    assert code != 0
    assert name in err, err
    assert created_by_me(before) == []


def test_corrupt_jpeg_is_refused_by_the_reference_path_too(ds, capsys):
    corrupt_jpeg_middle(ds / "images" / "train" / "synth_0003.jpg")
    code = main(
        [
            "digest",
            str(_json(ds)),
            "--reference",
            "--batches",
            "3",
            "--batch-size",
            "8",
            "--imgsz",
            "64",
            "--mosaic",
            "0",
        ]
    )
    err = capsys.readouterr().err
    assert code == 1 and "synth_0003.jpg: the JPEG's compressed data is damaged (libjpeg: Corrupt JPEG data" in err, err


def test_instances_cap_is_settable(ds, capsys):
    from pixpool.server.readers import load_dataset

    _runaway_label_file(ds)
    assert (
        main(["prepare", str(ds / "data.yaml"), "--imgsz", "64", "--processes", "1", "--max-instances-per-image", "0"])
        == 1
    )
    assert "--max-instances-per-image 0 is out of range" in capsys.readouterr().err
    dataset = load_dataset(ds / "data.yaml", max_instances_per_image=5000)
    assert max(r.num_instances for r in dataset.records) == 5000


def test_yolo_without_labels_is_refused_unless_allowed_and_counts_are_reported(ds, capsys):
    import shutil

    shutil.rmtree(ds / "labels")
    before = set(DEFAULT.segments())
    assert main(["prepare", str(ds / "data.yaml"), "--imgsz", "64", "--processes", "1", "--json"]) == 1
    err = capsys.readouterr().err
    assert (
        "data.yaml: none of the 24 images has a label file (looked for e.g. " in err
        and str(ds / "labels" / "train") in err
    )
    assert "--allow-unlabelled" in err and created_by_me(before) == []
    assert (
        main(["prepare", str(ds / "data.yaml"), "--imgsz", "64", "--processes", "1", "--json", "--allow-unlabelled"])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    try:
        assert out["dataset"]["labels_missing"] == 24 and out["dataset"]["background"] == 24
    finally:
        if not out["reused"]:
            remove_snapshot(out["snapshot"])


def test_yolo_images_without_labels_are_warned_about_by_count(ds, capsys, caplog):
    labels = ds / "labels" / "train"
    already = 24 - len(list(labels.glob("*.txt")))  # the synthetic set has background images without one
    for i in (1, 2, 3):
        (labels / f"synth_{i:04d}.txt").unlink()
    assert main(["prepare", str(ds / "data.yaml"), "--imgsz", "64", "--processes", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    try:
        assert out["dataset"]["labels_missing"] == already + 3
        assert any(
            f"{already + 3} of 24 images have no label file" in r.getMessage() and "synth_0001.txt" in r.getMessage()
            for r in caplog.records
        )
    finally:
        if not out["reused"]:
            remove_snapshot(out["snapshot"])


def test_two_spellings_of_one_data_yaml_share_a_snapshot(ds, capsys):
    import yaml

    data = yaml.safe_load((ds / "data.yaml").read_text())
    names = data["names"]
    as_list = names if isinstance(names, list) else [names[i] for i in sorted(names)]
    (ds / "list.yaml").write_text(yaml.safe_dump({**data, "names": as_list}))
    (ds / "dict.yaml").write_text(yaml.safe_dump({**data, "names": dict(enumerate(as_list))}))
    assert main(["prepare", str(ds / "list.yaml"), "--imgsz", "64", "--processes", "1", "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    try:
        assert main(["prepare", str(ds / "dict.yaml"), "--imgsz", "64", "--processes", "1", "--json"]) == 0
        second = json.loads(capsys.readouterr().out)
        assert second["snapshot"] == first["snapshot"] and second["reused"] is True
    finally:
        remove_snapshot(first["snapshot"])


def test_decode_failure_in_worker_leaves_shm_alone(ds, capsys):
    # Valid header (Pillow reads the size) but the pixel data is not a JPEG scan: cv2 fails
    # in a decode worker, after the segments exist.
    import cv2
    import numpy as np

    path = ds / "images" / "train" / "synth_0007.jpg"
    ok, enc = cv2.imencode(".png", np.zeros((50, 60, 3), np.uint8))
    data = bytearray(enc.tobytes())
    data[60:] = b"\0" * (len(data) - 60)  # IHDR intact, IDAT zeroed
    path.write_bytes(bytes(data))
    before = set(DEFAULT.segments())
    code = main(["prepare", str(_json(ds)), "--imgsz", "96", "--processes", "2"])
    err = capsys.readouterr().err
    if code == 0:  # pragma: no cover - depends on the decoder's tolerance
        pytest.skip("this OpenCV build decodes the damaged file")
    assert "synth_0007.jpg" in err, err
    assert created_by_me(before) == []


def test_prepare_json_ls_and_clean(store, ds, capsys):
    before = set(Store.of(store).segments())
    base = None
    at = ["--store", store]
    try:
        assert main(["prepare", str(_json(ds)), "--imgsz", "96", "--processes", "1", "--json", *at]) == 0
        out = json.loads(capsys.readouterr().out)
        base = out["snapshot"]
        assert out["reused"] is False and out["records"] == 24
        assert out["image_bytes"] == out["decoded_bytes"] and out["dtype"] == "uint8"  # the default
        assert set(parts_of_base(base).values()) <= set(Store.of(store).segments())
        assert main(["prepare", str(_json(ds)), "--imgsz", "96", "--json", *at]) == 0
        assert json.loads(capsys.readouterr().out)["reused"] is True
        assert main(["prepare", str(_json(ds)), "--imgsz", "96", *at]) == 0
        table = capsys.readouterr().out
        assert base + "-img" in table and "decoded uint8 equivalent" in table
        assert ("in the page cache now" in table) == (store != "/dev/shm")
        assert main(["ls", "--json", *at]) == 0
        rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
        assert rows[base]["records"] == 24 and rows[base]["complete"] and rows[base]["in_use_by"] == []
        if store != "/dev/shm":  # the other store does not see it
            assert main(["ls", "--json"]) == 0
            assert base not in {r["name"] for r in json.loads(capsys.readouterr().out)}
        assert main(["clean", base, "--dry-run", *at]) == 0
        assert "would remove " + base + "-img" in capsys.readouterr().out
        assert set(parts_of_base(base).values()) <= set(Store.of(store).segments())
        assert main(["clean", base, *at]) == 0
        assert "removed " + base + "-meta" in capsys.readouterr().out
        assert not set(parts_of_base(base).values()) & set(Store.of(store).segments())
    finally:
        if base:
            remove_snapshot(base, store)
    assert created_by_me(before, store) == []


def test_sigkill_during_prepare_then_clean_removes_everything(coco128, tmp_path):
    # A dataset big enough to be caught mid-decode: coco128 listed four times (duplicates
    # are records too), prepared at 640 by two decode processes, which must die with it
    # (they hold the arena open: while they lived, clean would rightly keep it).
    src = json.loads((coco128 / "annotations" / "instances_train2017.json").read_text())
    images, anns = [], []
    for rep in range(4):
        for im in src["images"]:
            images.append({**im, "id": im["id"] + rep * 10**7})
        for a in src["annotations"]:
            anns.append({**a, "id": a["id"] + rep * 10**8, "image_id": a["image_id"] + rep * 10**7})
    ann = tmp_path / "instances_big.json"
    ann.write_text(json.dumps({**src, "images": images, "annotations": anns}))
    img_dir = coco128 / "images" / "train2017"
    base = base_name(fingerprint(load_dataset(ann, img_dir), imgsz=640))
    parts = parts_of_base(base)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pixpool.cli", "prepare", str(ann), "--images", str(img_dir), "--processes", "2", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        wait_for(
            lambda: os.path.exists(DEFAULT.path(parts["img"])) or proc.poll() is not None,
            60,
            "the image arena to appear",
            poll_s=0.002,
        )
        assert proc.poll() is None, proc.communicate()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL
        left = [s for s in parts.values() if os.path.exists(DEFAULT.path(s))]
        assert left, "the killed preparation left nothing to clean (it finished too fast)"
        assert not read_header(parts["meta"]).is_complete
        # neither the dead process nor its decode workers map anything any more
        wait_for(
            lambda: not any((h := holds_of(s)) is not None and h.in_use for s in parts.values()),
            30,
            "the killed preparation's workers to exit",
            poll_s=0.002,
        )
        assert main(["clean", base]) == 0
        assert not [s for s in parts.values() if os.path.exists(DEFAULT.path(s))]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        proc.stdout.close()
        proc.stderr.close()
        remove_snapshot(base)


def test_clean_decisions():
    """What ``clean`` keeps is what is held (``shared.transport.holds``), whatever pid a ring's name
    carries: a ring of "live" pid 1 nobody holds goes, a held one stays with its state."""
    from pixpool.cli.snapshots import plan_clean
    from pixpool.shared.transport.holds import Holds
    from pixpool.shared.transport.names import ring_segment, snapshot_parts

    me = os.getpid()
    unheld, mapped = Holds(False, False, False), Holds(True, False, False)
    a, b = snapshot_parts(snapshot_base("aaaa")), snapshot_parts(snapshot_base("bbbb"))
    segs = [
        a["meta"], a["img"], a["tgt"],  # unheld: goes
        b["meta"], b["img"], b["tgt"],  # one part held: stays whole
        ring_segment(1, "01"),  # named after a pid that lives (PID 1), unheld: goes
        ring_segment(1, "02"),  # its daemon holds it: stays
        "pixpool-snap-cccc-meta",  # an older release's name: only with unrecognised
        ring_segment(1, "03"),  # its daemon died, its trainer (elsewhere) still maps it: stays
    ]  # fmt: skip
    holds = {s: unheld for s in segs}
    holds |= {b["img"]: mapped, segs[7]: Holds(True, True, False), segs[9]: Holds(True, False, True)}
    remove, kept = plan_clean(segs, holds, pids={b["img"]: {me}})
    assert remove == sorted(segs[:3] + [segs[6]])
    assert set(kept) == set(segs[3:6] + segs[7:])
    assert f"in use by pid {me}" in kept[b["meta"]]
    assert kept[segs[7]] == (
        "in use by a process in another PID namespace or container (its daemon is alive, no trainer maps it)"
    )
    assert "its daemon is gone, its trainer maps it" in kept[segs[9]]
    # No flag overrides a hold: --all (unrecognised) only adds the unknown unheld name.
    remove_all, kept_all = plan_clean(segs, holds, unrecognised=True)
    assert remove_all == sorted(segs[:3] + [segs[6], segs[8]])
    assert set(kept_all) == set(segs[3:6] + [segs[7], segs[9]])


def test_clean_keep_complete_removes_stale_rings_but_keeps_snapshots(synthetic_data, capsys):
    """What a service manager runs after the daemon stops: the prepared snapshot stays for the restart."""
    from pixpool.server.snapshot.prepare import PrepareOptions, prepare_snapshot
    from pixpool.shared.transport.names import ring_segment
    from pixpool.shared.transport.shm import SharedSegment

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(30)
    ring = ring_segment(dead.pid, "01")
    SharedSegment.create(ring, 4096).close()
    result = prepare_snapshot(load_dataset(synthetic_data.coco_json), PrepareOptions(imgsz=64, processes=1))
    snap = result.snapshot
    names = list(snap.segment_names)
    snap.close()
    try:
        assert main(["clean", "--keep-complete", ring, snap.name]) == 0
        out = capsys.readouterr().out
        assert f"removed {ring}" in out
        assert not os.path.exists(DEFAULT.path(ring))
        assert all(os.path.exists(DEFAULT.path(n)) for n in names), out
    finally:
        if os.path.exists(DEFAULT.path(ring)):
            os.unlink(DEFAULT.path(ring))
        if not result.reused:
            remove_snapshot(snap.name)
