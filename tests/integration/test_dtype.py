"""The snapshot's dtype: a uint8 snapshot (the default) holds the float32 snapshot's integers at
a quarter of the bytes, is another snapshot (name, reuse, lineage), and gives the very same
batches; the float32 snapshot stays one flag away (``--dtype float32``).

Integration tests: preparation spawns a decode worker (``processes=2``); the daemon test
starts a temporary daemon through ``pixpool digest``. Every snapshot made here is removed.
"""

from __future__ import annotations

import json
import math
import re

import cv2
import numpy as np
import pytest

from helpers.daemon import real_daemon
from helpers.snapshot import created_by_me, remove_snapshot
from pixpool.cli import main
from pixpool.ops import accounting as accountant
from pixpool.server.augment import render_batch
from pixpool.server.readers import load_dataset
from pixpool.server.snapshot import layout
from pixpool.server.snapshot.fingerprint import lineage_of
from pixpool.server.snapshot.handle import list_snapshots
from pixpool.server.snapshot.prepare import PrepareOptions, prepare_snapshot
from pixpool.shared.errors import ConfigError
from pixpool.shared.stream.config import FILL_VALUE, AugmentConfig, DaemonConfig, StreamSettings
from pixpool.shared.stream.digest import batch_digest
from pixpool.shared.stream.sampler import num_batches
from pixpool.shared.transport.store import DEFAULT

IMGSZ = 96

# Every route configuration: each one reads the source views differently (mosaic tiles,
# the letterboxed record, a mixup partner) or does other arithmetic after the read.
ROUTES = {
    "mosaic": {},
    "no_mosaic": {"mosaic": 0.0},
    "affine": {"degrees": 10.0, "shear": 5.0, "translate": 0.2, "scale": 0.6},
    "perspective": {"perspective": 0.0008, "mosaic": 0.5},
    "copy_paste": {"copy_paste": 0.8},
    "mixup": {"mixup": 0.7, "copy_paste": 0.3},
    "flips": {"fliplr": 0.5, "flipud": 0.5},
    "no_hsv": {"hsv_h": 0.0, "hsv_s": 0.0, "hsv_v": 0.0},
    "validation": {"train_route": False},
}


def _prepare_pair(dataset, imgsz: int):
    """(float32 result, uint8 result), prepared here; the caller removes both."""
    f32 = prepare_snapshot(dataset, PrepareOptions(imgsz=imgsz, processes=1, dtype="float32"))
    try:
        u8 = prepare_snapshot(dataset, PrepareOptions(imgsz=imgsz, processes=2, dtype="uint8"))
    except BaseException:
        _remove(f32)
        raise
    return f32, u8


def _remove(*results) -> None:
    for r in results:
        r.snapshot.close()
        if not r.reused:
            remove_snapshot(r.snapshot.name)


@pytest.fixture(scope="module")
def pair(synthetic_data):
    dataset = load_dataset(synthetic_data.coco_json)
    f32, u8 = _prepare_pair(dataset, IMGSZ)
    try:
        yield dataset, f32, u8
    finally:
        _remove(f32, u8)


def _reference_decode(path: str, imgsz: int) -> np.ndarray:
    """What a prepared record must hold, written out with OpenCV alone: imread, then the long
    side resized to imgsz with INTER_LINEAR on the 8-bit image."""
    image = cv2.imread(path, cv2.IMREAD_COLOR)
    h, w = image.shape[:2]
    r = imgsz / max(h, w)
    if r == 1:
        return image
    size = (min(math.ceil(w * r), imgsz), min(math.ceil(h * r), imgsz))
    return cv2.resize(image, size, interpolation=cv2.INTER_LINEAR)


def test_uint8_arena_holds_the_float32_values_at_a_quarter_of_the_bytes(pair):
    _, f32, u8 = pair
    a, b = f32.snapshot, u8.snapshot
    assert (a.dtype, b.dtype) == ("float32", "uint8") and (f32.dtype, u8.dtype) == ("float32", "uint8")
    assert a.header.dtype_code == layout.FLOAT32_CODE and b.header.dtype_code == layout.UINT8_CODE
    assert a.name != b.name and not f32.reused and not u8.reused
    assert u8.image_bytes == u8.decoded_bytes == f32.decoded_bytes and f32.image_bytes == 4 * u8.image_bytes
    for i in range(len(a)):
        x, y = a.image(i), b.image(i)
        assert x.dtype == np.float32 and y.dtype == np.uint8 and not y.flags.writeable
        assert np.subtract(y, np.float32(FILL_VALUE), dtype=np.float32).tobytes() == x.tobytes(), f"record {i}"
    np.testing.assert_array_equal(b.index["image_offset"] * 4, a.index["image_offset"])
    for field in ("height", "width", "orig_height", "orig_width", "target_start", "target_count", "point_start"):
        np.testing.assert_array_equal(a.index[field], b.index[field])
    for i in range(len(a)):
        ta, tb = a.targets(i), b.targets(i)
        assert ta.classes.tobytes() == tb.classes.tobytes() and ta.boxes.tobytes() == tb.boxes.tobytes()
    measured = accountant.snapshot_bytes(b)
    assert measured["dtype"] == "uint8" and measured["ratio"] == 1.0 and measured["image_bytes"] == u8.image_bytes
    assert "uint8 images / uint8 equivalent = 1.000" in accountant.format_snapshot_report(measured)
    assert accountant.snapshot_bytes(a)["ratio"] == 4.0


def test_prepared_pixels_are_the_reference_decode(pair):
    dataset, f32, u8 = pair
    for i, rec in enumerate(dataset.records):
        ref = _reference_decode(rec.image_path, IMGSZ)
        assert u8.snapshot.image(i).tobytes() == ref.tobytes(), f"record {i}"
        assert f32.snapshot.image(i).tobytes() == (ref.astype(np.float32) - np.float32(FILL_VALUE)).tobytes(), (
            f"record {i}"
        )


def test_coco128_prepared_pixels_are_the_reference_decode(coco128):
    # Real photos, every record resized (320 < their long side), two decoders of each dtype.
    dataset = load_dataset(coco128 / "annotations" / "instances_train2017.json", coco128 / "images" / "train2017")
    f32 = prepare_snapshot(dataset, PrepareOptions(imgsz=320, processes=2, dtype="float32"))
    try:
        u8 = prepare_snapshot(dataset, PrepareOptions(imgsz=320, processes=2, dtype="uint8"))
        try:
            for i, rec in enumerate(dataset.records):
                ref = _reference_decode(rec.image_path, 320)
                assert u8.snapshot.image(i).tobytes() == ref.tobytes(), rec.image_path
                assert f32.snapshot.image(i).tobytes() == (ref.astype(np.float32) - np.float32(FILL_VALUE)).tobytes(), (
                    rec.image_path
                )
        finally:
            _remove(u8)
    finally:
        _remove(f32)


@pytest.mark.parametrize("name", sorted(ROUTES))
def test_batches_are_byte_identical_across_dtypes(pair, name):
    _, f32, u8 = pair
    for hsv_on_device in (False, True):
        st = StreamSettings(
            seed=5, batch_size=8, hsv_on_device=hsv_on_device, augment=AugmentConfig(imgsz=IMGSZ, **ROUTES[name])
        )
        for b in range(num_batches(len(f32.snapshot), st, 1)):
            x = render_batch(f32.snapshot, st, 1, b, keep_float=True)
            y = render_batch(u8.snapshot, st, 1, b, keep_float=True)
            assert [f.tobytes() for f in x.floats] == [f.tobytes() for f in y.floats], (name, b)
            assert batch_digest(x.images, x.targets) == batch_digest(y.images, y.targets), (name, b)
            np.testing.assert_array_equal(x.samples, y.samples)


def test_reuse_matches_the_same_dtype_only(pair):
    dataset, f32, u8 = pair
    again = {
        d: prepare_snapshot(dataset, PrepareOptions(imgsz=IMGSZ, processes=1, dtype=d)) for d in ("uint8", "float32")
    }
    try:
        assert (
            again["uint8"].reused
            and again["uint8"].snapshot.name == u8.snapshot.name
            and again["uint8"].dtype == "uint8"
        )
        assert (
            again["float32"].reused
            and again["float32"].snapshot.name == f32.snapshot.name
            and again["float32"].dtype == "float32"
        )
        assert again["uint8"].as_dict()["dtype"] == "uint8"
    finally:
        _remove(*again.values())


def test_a_new_snapshot_of_one_dtype_never_supersedes_the_other(synthetic_copy):
    # The same dataset, prepared persistently as uint8, then prepared again as float32 with
    # its own lineage after an input changed: the uint8 snapshot stays (nobody maps it, so
    # one shared lineage would have removed it).
    data = synthetic_copy / "annotations" / "instances_train.json"
    before = set(DEFAULT.segments())
    made = []
    try:
        u8 = prepare_snapshot(
            load_dataset(data),
            PrepareOptions(imgsz=64, processes=1, dtype="uint8", keep_snapshot=True),
            lineage=lineage_of(data, None, 64, "uint8"),
        )
        made.append(u8.snapshot.name)
        u8.snapshot.close()
        assert lineage_of(data, None, 64, "uint8") != lineage_of(data, None, 64, "float32")
        f32 = prepare_snapshot(
            load_dataset(data),
            PrepareOptions(imgsz=64, processes=1, dtype="float32", keep_snapshot=True),
            lineage=lineage_of(data, None, 64, "float32"),
        )
        made.append(f32.snapshot.name)
        f32.snapshot.close()
        (synthetic_copy / "images" / "train" / "synth_0001.jpg").touch()  # a changed input: a new float32 snapshot
        f32b = prepare_snapshot(
            load_dataset(data),
            PrepareOptions(imgsz=64, processes=1, dtype="float32", keep_snapshot=True),
            lineage=lineage_of(data, None, 64, "float32"),
        )
        made.append(f32b.snapshot.name)
        f32b.snapshot.close()
        names = {info.name for info in list_snapshots()}
        assert u8.snapshot.name in names, "the uint8 snapshot was removed by a float32 preparation"
        assert f32.snapshot.name not in names, "the superseded float32 snapshot should have gone"
    finally:
        for name in made:
            remove_snapshot(name)
    assert created_by_me(before) == []


def test_prepare_cli_reports_the_dtype_and_ls_shows_it(synthetic_copy, capsys):
    data = str(synthetic_copy / "annotations" / "instances_train.json")
    before = set(DEFAULT.segments())
    base = None
    try:
        assert main(["prepare", data, "--imgsz", "64", "--processes", "1", "--dtype", "uint8", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        base = out["snapshot"]
        assert out["dtype"] == "uint8" and out["image_bytes"] == out["decoded_bytes"] and not out["reused"]
        assert main(["prepare", data, "--imgsz", "64", "--dtype", "uint8"]) == 0
        table = capsys.readouterr().out
        assert "uint8, re-attached existing" in table and "uint8 images / uint8 equivalent = 1.000" in table
        assert main(["ls", "--json"]) == 0
        rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
        assert rows[base]["dtype"] == "uint8" and rows[base]["image_nbytes"] == out["image_bytes"]
        assert main(["ls"]) == 0
        line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith(base))
        assert "uint8" in line.split()
    finally:
        if base:
            remove_snapshot(base)
    assert created_by_me(before) == []


@pytest.mark.parametrize("command", ["prepare", "serve", "digest"])
def test_an_unknown_dtype_names_the_flag_and_the_choices(synthetic_data, capsys, command):
    before = set(DEFAULT.segments())
    extra = ["--reference"] if command == "digest" else []
    assert main([command, str(synthetic_data.coco_json), "--dtype", "float16", *extra]) == 1
    err = capsys.readouterr().err
    assert "--dtype 'float16'" in err and "['float32', 'uint8']" in err and "(field 'dtype')" in err
    assert created_by_me(before) == []


def test_the_python_api_refuses_an_unknown_dtype(synthetic_data):
    with pytest.raises(
        ConfigError, match=r"field 'dtype' = 'f4' is not one of the choices; use one of \['float32', 'uint8'\]"
    ) as info:
        DaemonConfig(data="x", dtype="f4")
    assert info.value.field == "dtype"
    before = set(DEFAULT.segments())
    with pytest.raises(ConfigError, match="field 'dtype'"):
        prepare_snapshot(load_dataset(synthetic_data.coco_json), PrepareOptions(imgsz=64, processes=1, dtype="int8"))
    assert created_by_me(before) == []


def test_daemon_digest_of_a_float32_snapshot_equals_the_reference(synthetic_data, capsys):
    """Through a temporary daemon (``pixpool digest --dtype float32 --workers 1``): the bytes a
    trainer receives from the float32 snapshot (one flag from the uint8 default, which
    tests/integration/test_digest.py serves) are the reference pipeline's."""
    before = set(DEFAULT.segments())
    # imgsz 128: not the module's snapshots (this process maps those; the digest commands must
    # make, and remove, their own)
    flags = [str(synthetic_data.coco_json), "--seed", "6", "--batches", "3", "--batch-size", "8", "--imgsz", "128", "--copy-paste", "0.5", "--mixup", "0.3",
             "--degrees", "5", "--flipud", "0.5", "--json"]  # fmt: skip
    assert main(["digest", *flags, "--workers", "1", "--dtype", "float32"]) == 0
    daemon = json.loads(capsys.readouterr().out)
    assert main(["digest", *flags, "--reference"]) == 0
    ref = json.loads(capsys.readouterr().out)
    assert daemon["path"] == "daemon" and len(daemon["digests"]) == 3 and daemon["digests"] == ref["digests"]
    assert main(["digest", *flags, "--in-process", "--processes", "1", "--dtype", "float32"]) == 0
    assert json.loads(capsys.readouterr().out)["digests"] == ref["digests"]
    assert created_by_me(before) == []


def test_status_and_memory_report_the_dtype_held(synthetic_data, capsys):
    # The float32 snapshot, asked for by name: the default (uint8) is what every other daemon
    # test serves (tests/integration/test_memory.py, test_daemon.py).
    with real_daemon(synthetic_data.coco_json, imgsz=160, workers=1, dtype="float32") as (_, d):
        assert main(["memory", "--socket-dir", d, "--json"]) == 0
        mem = json.loads(capsys.readouterr().out)
        assert main(["memory", "--socket-dir", d]) == 0
        report = capsys.readouterr().out
        assert main(["status", "--socket-dir", d, "--json"]) == 0
        st = json.loads(capsys.readouterr().out)
        assert main(["status", "--socket-dir", d]) == 0
        text = capsys.readouterr().out
    assert mem["dtype"] == "float32" and mem["image_bytes"] == 4 * mem["decoded_bytes"] > 0
    assert mem["snapshot_bytes"] > mem["image_bytes"]  # measured from the segments: images, index, targets
    assert st["snapshot"]["dtype"] == "float32" and st["snapshot"]["image_bytes"] == mem["image_bytes"]
    assert "float32" in text.splitlines()[1]
    assert re.search(r"snapshot retained [\d.]+ \w+ \(float32\)", report), report


def test_a_snapshot_centred_by_another_fill_is_refused_when_attached(pair):
    """The route adds back the header's fill (the kernel is handed it); a snapshot whose header
    names another fill than this pixpool's is refused at attach, naming the segment and both values."""
    import dataclasses

    from pixpool.server.snapshot.handle import Snapshot
    from pixpool.shared.errors import SnapshotError
    from pixpool.shared.transport.names import snapshot_parts

    _, f32, _ = pair
    assert f32.snapshot.fill == FILL_VALUE
    meta = snapshot_parts(f32.snapshot.name)["meta"]
    with open(DEFAULT.path(meta), "r+b") as f:
        original = f.read(layout.HEADER_NBYTES)
        changed = dataclasses.replace(layout.unpack_header(original), fill=100.0)
        f.seek(0)
        f.write(layout.pack_header(changed))
    try:
        with pytest.raises(SnapshotError) as err:
            Snapshot.attach(f32.snapshot.name)
        text = str(err.value)
        assert meta in text and "fill 100.0" in text and f"fill {FILL_VALUE!r}" in text, text
    finally:
        with open(DEFAULT.path(meta), "r+b") as f:
            f.write(original)
    Snapshot.attach(f32.snapshot.name).close()  # restored: attaches again
