"""Preparation: exact bytes, reuse without decoding, all-or-nothing rollback, odd image kinds."""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace

import cv2
import numpy as np
import pytest
from PIL import Image

from helpers import failing_decoder
from helpers.snapshot import created_by_me, dataset_of, write_jpegs
from pixpool.ops import accounting as accountant
from pixpool.server.readers import load_dataset
from pixpool.server.snapshot import decode, prepare
from pixpool.server.snapshot.fingerprint import base_name, fingerprint
from pixpool.server.snapshot.prepare import PreparationTerminated, PrepareOptions, prepare_snapshot
from pixpool.shared.errors import CapacityError, ImageDecodeError
from pixpool.shared.stream.config import FILL_VALUE
from pixpool.shared.stream.records import Dataset
from pixpool.shared.transport.shm import SharedSegment
from pixpool.shared.transport.store import DEFAULT, Store


def _private(dataset: Dataset, tmp_path) -> Dataset:
    """The same images and targets under a fingerprint of their own (reached through a
    symlinked folder: other paths, the same files), so a benchmark or another test run
    preparing coco128 at the same time is neither reused nor reported as "being prepared"."""
    import dataclasses

    folder = os.path.dirname(dataset.records[0].image_path)
    alias = tmp_path / "private-images"
    alias.symlink_to(folder, target_is_directory=True)
    records = tuple(
        dataclasses.replace(r, image_path=str(alias / os.path.relpath(r.image_path, folder))) for r in dataset.records
    )
    return Dataset(records, dataset.names, dataset.source_files)


def test_coco128_float32_is_exactly_four_times_uint8(coco128, prepared, tmp_path):
    dataset = _private(
        load_dataset(coco128 / "annotations" / "instances_train2017.json", coco128 / "images" / "train2017"), tmp_path
    )
    result = prepare_snapshot(dataset, PrepareOptions(imgsz=640, processes=2, dtype="float32"))
    prepared.append(result)
    assert not result.reused and result.records == len(dataset) == 128
    assert result.image_bytes == 4 * result.decoded_bytes
    snap = result.snapshot
    measured = accountant.snapshot_bytes(snap)
    assert measured["image_bytes"] == result.image_bytes == os.stat("/dev/shm/" + snap.name + "-img").st_size
    assert measured["decoded_bytes"] == result.decoded_bytes
    assert measured["ratio"] == 4.0
    for i in (0, 17, 127):
        rec = dataset.records[i]
        np.testing.assert_array_equal(snap.image(i), decode.prepare_image(rec.image_path, 640))
        t = snap.targets(i)
        np.testing.assert_array_equal(t.classes, rec.classes)
        np.testing.assert_array_equal(t.boxes, rec.boxes)
        assert len(t.polygons) == len(rec.polygons)
        for a, b in zip(t.polygons, rec.polygons):
            np.testing.assert_array_equal(a, b)
        assert max(snap.image(i).shape[:2]) == 640
    assert snap.max_instances == max(r.num_instances for r in dataset.records)
    d = result.as_dict()
    for key in ("snapshot", "records", "image_bytes", "decoded_bytes", "target_bytes", "reused", "seconds"):
        assert key in d


def test_second_prepare_reuses_and_decodes_nothing(store, synthetic_data, prepared, monkeypatch):
    dataset = load_dataset(synthetic_data.coco_json)
    first = prepare_snapshot(dataset, PrepareOptions(imgsz=160, processes=1, store=store))
    prepared.append(first)
    checksum = first.snapshot.checksum()

    calls = []

    def forbidden(*args, **kwargs):
        calls.append(args)
        raise AssertionError("reuse must not decode or read image headers")

    monkeypatch.setattr(decode, "decode_bgr", forbidden)
    monkeypatch.setattr(prepare, "header_size_hw", forbidden)
    second = prepare_snapshot(
        load_dataset(synthetic_data.coco_json), PrepareOptions(imgsz=160, processes=2, store=store)
    )
    prepared.append(second)
    assert os.path.isfile(os.path.join(store, first.snapshot.name + "-img")) and first.snapshot.store == store
    assert second.reused and not first.reused
    assert calls == []
    assert second.snapshot.name == first.snapshot.name
    assert second.snapshot.checksum() == checksum
    assert second.as_dict()["reused"] is True


def test_any_input_change_gives_another_name(tmp_path):
    paths = write_jpegs(tmp_path / "img", [(40, 60), (50, 30), (64, 64)])
    ann = tmp_path / "ann.json"
    ann.write_text("{}")
    ds = dataset_of(paths, [ann])
    fp = fingerprint(ds, imgsz=160)
    assert fingerprint(dataset_of(paths, [ann]), imgsz=160) == fp  # deterministic
    assert fingerprint(ds, imgsz=192) != fp
    ann.write_text('{"x": 1}')
    assert fingerprint(ds, imgsz=160) == fp, "the records did not change: a file's spelling must not matter"
    import dataclasses

    moved = dataclasses.replace(ds.records[0], boxes=ds.records[0].boxes + 0.01)
    assert fingerprint(Dataset((moved, *ds.records[1:]), ds.names, ds.source_files), imgsz=160) != fp
    assert fingerprint(Dataset(ds.records, ("a", "b", "z"), ds.source_files), imgsz=160) != fp
    fp2 = fp
    st = os.stat(paths[0])
    os.utime(paths[0], ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert fingerprint(ds, imgsz=160) != fp2
    head = f"pixpool-u{os.geteuid()}-snap-"
    assert base_name(fp).startswith(head) and len(base_name(fp)) == len(head) + 16


def test_pixels_changed_with_size_and_mtime_kept_are_prepared_again(tmp_path, prepared):
    """Rewrite an image in place to other pixels of the same byte count and set its mtime
    back: the old snapshot must not be re-attached (stale pixels)."""
    paths = write_jpegs(tmp_path / "img", [(40, 60), (50, 30)])
    ds = dataset_of(paths, [])
    first = prepare_snapshot(ds, PrepareOptions(imgsz=64, processes=1))
    prepared.append(first)
    data = bytearray(open(paths[0], "rb").read())
    st = os.stat(paths[0])
    other = cv2.imencode(".jpg", np.full((40, 60, 3), 200, np.uint8))[1].tobytes()
    if len(other) > len(data):
        pytest.skip("the stand-in image encodes larger than the original")
    data[: len(other)] = other  # bytes past the JPEG end marker are ignored by decoders
    with open(paths[0], "r+b") as f:  # in place: same inode, same size
        f.write(data)
    os.utime(paths[0], ns=(st.st_atime_ns, st.st_mtime_ns))
    after = os.stat(paths[0])
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)
    second = prepare_snapshot(ds, PrepareOptions(imgsz=64, processes=1))
    prepared.append(second)
    assert not second.reused and second.snapshot.name != first.snapshot.name
    assert not np.array_equal(second.snapshot.image(0), first.snapshot.image(0)), (
        "the new snapshot holds the new pixels"
    )
    assert np.array_equal(second.snapshot.image(1), first.snapshot.image(1))


@pytest.mark.parametrize("processes", [1, 2])
def test_failure_at_record_k_leaves_no_segment(synthetic_data, processes, store):
    dataset = load_dataset(synthetic_data.coco_json)
    before = set(Store.of(store).segments())
    assert failing_decoder.FAIL_AT == 7  # the decoder that claims record 7 fails (spawned ones too)
    with pytest.raises(ImageDecodeError, match="injected failure at record 7") as info:
        prepare_snapshot(
            dataset,
            PrepareOptions(imgsz=160, processes=processes, store=store),
            decoder=failing_decoder.__name__,
        )
    assert dataset.records[7].image_path in str(info.value)
    assert created_by_me(before, store) == []
    assert not any(s.startswith(base_name(fingerprint(dataset, imgsz=160))) for s in Store.of(store).segments())


def _decode_calls_then(monkeypatch, k: int, action):
    real = decode.decode_bgr
    count = {"n": 0}
    me = os.getpid()

    def wrapper(path):
        if os.getpid() != me:  # only the preparing process acts
            return real(path)
        count["n"] += 1
        if count["n"] == k:
            action()
        return real(path)

    monkeypatch.setattr(decode, "decode_bgr", wrapper)
    return count


@pytest.mark.parametrize("processes", [1, 2])
def test_keyboard_interrupt_leaves_no_segment(synthetic_data, monkeypatch, processes, store):
    # With 2 processes this process is one of the decoders: it decodes its first records
    # while the worker is still starting, so the interrupt lands mid-preparation either way.
    dataset = load_dataset(synthetic_data.coco_json)
    before = set(Store.of(store).segments())

    def interrupt():
        raise KeyboardInterrupt

    count = _decode_calls_then(monkeypatch, 5, interrupt)
    with pytest.raises(KeyboardInterrupt):
        prepare_snapshot(dataset, PrepareOptions(imgsz=160, processes=processes, store=store))
    assert count["n"] == 5
    assert created_by_me(before, store) == []


@pytest.mark.parametrize("processes", [1, 2])
def test_sigterm_leaves_no_segment_and_restores_handler(synthetic_data, monkeypatch, processes):
    dataset = load_dataset(synthetic_data.coco_json)
    before = set(DEFAULT.segments())
    handler_before = signal.getsignal(signal.SIGTERM)
    _decode_calls_then(monkeypatch, 3, lambda: os.kill(os.getpid(), signal.SIGTERM))
    with pytest.raises(PreparationTerminated):
        prepare_snapshot(dataset, PrepareOptions(imgsz=160, processes=processes))
    assert created_by_me(before) == []
    assert signal.getsignal(signal.SIGTERM) == handler_before


def test_capacity_refused_before_allocating(synthetic_data, monkeypatch, store):
    dataset = load_dataset(synthetic_data.coco_json)
    before = set(Store.of(store).segments())
    monkeypatch.setattr(prepare.psutil, "virtual_memory", lambda: SimpleNamespace(available=1000))
    if store != "/dev/shm":
        # A disk store's pages are page cache: little memory is no reason to refuse, little room is.
        monkeypatch.setattr(prepare, "free_nbytes", lambda path: 1000 if path == store else os.statvfs(path).f_bavail)
    with pytest.raises(CapacityError) as info:
        prepare_snapshot(dataset, PrepareOptions(imgsz=160, processes=1, store=store))
    msg = str(info.value)
    assert "1000 bytes" in msg and "--imgsz" in msg
    if store != "/dev/shm":
        assert f"the store {store} has 1000 bytes free" in msg
    assert created_by_me(before, store) == []


def test_a_disk_store_does_not_need_the_memory(store, synthetic_data, monkeypatch, prepared):
    """Memory below the snapshot's size refuses a memory store and not a disk one."""
    from pixpool.shared.transport.store import is_memory

    monkeypatch.setattr(prepare.psutil, "virtual_memory", lambda: SimpleNamespace(available=1000))
    dataset = load_dataset(synthetic_data.coco_json)
    if is_memory(store):
        with pytest.raises(CapacityError, match="bytes of memory are available"):
            prepare_snapshot(dataset, PrepareOptions(imgsz=96, processes=1, store=store))
        return
    result = prepare_snapshot(dataset, PrepareOptions(imgsz=96, processes=1, store=store))
    prepared.append(result)
    assert len(result.snapshot) == len(dataset) and not result.reused


def test_stale_incomplete_snapshot_is_replaced(store, synthetic_data, prepared):
    dataset = load_dataset(synthetic_data.coco_json)
    base = base_name(fingerprint(dataset, imgsz=160))
    # What a killed preparation leaves: a meta segment without the completeness mark.
    with SharedSegment.create(base + "-meta", 4096, store=Store.of(store)) as stale:
        stale.buf[:8] = b"PIXPSNAP"
    result = prepare_snapshot(dataset, PrepareOptions(imgsz=160, processes=1, store=store))
    prepared.append(result)
    assert not result.reused and result.snapshot.name == base
    assert len(result.snapshot) == len(dataset)


def _write_odd_images(folder):
    folder.mkdir()
    rng = np.random.default_rng(3)
    gray = folder / "gray.png"
    cv2.imwrite(str(gray), rng.integers(0, 256, (30, 50), dtype=np.uint8))
    rgba = folder / "rgba.png"
    cv2.imwrite(str(rgba), rng.integers(0, 256, (40, 36, 4), dtype=np.uint8))
    deep = folder / "deep16.png"
    cv2.imwrite(str(deep), rng.integers(0, 65536, (24, 70, 3), dtype=np.uint16))
    rotated = folder / "exif6.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    Image.fromarray(rng.integers(0, 256, (40, 80, 3), dtype=np.uint8)).save(rotated, exif=exif, quality=95)
    rotated_png = folder / "exif6.png"  # OpenCV also honours a PNG eXIf chunk
    Image.fromarray(rng.integers(0, 256, (20, 50, 3), dtype=np.uint8)).save(rotated_png, exif=exif)
    cmyk = folder / "cmyk.jpg"
    Image.fromarray(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)).convert("CMYK").save(cmyk, quality=95)
    return [str(gray), str(rgba), str(deep), str(rotated), str(rotated_png), str(cmyk)]


def test_odd_image_kinds_become_3_channel_8_bit(tmp_path, prepared):
    paths = _write_odd_images(tmp_path / "odd")
    # header sizes used for allocation, EXIF orientation applied
    assert prepare.header_size_hw(paths[3]) == (80, 40)
    assert prepare.header_size_hw(paths[4]) == (50, 20)
    dataset = dataset_of(paths)
    result = prepare_snapshot(dataset, PrepareOptions(imgsz=64, processes=1))
    prepared.append(result)
    snap = result.snapshot
    for i, path in enumerate(paths):
        decoded = decode.decode_bgr(path)
        assert decoded.dtype == np.uint8 and decoded.ndim == 3 and decoded.shape[2] == 3
        row = snap.index[i]
        assert (int(row["orig_height"]), int(row["orig_width"])) == decoded.shape[:2]
        img = snap.image(i)
        assert img.dtype == np.uint8 and img.shape[2] == 3 and max(img.shape[:2]) == 64  # the default snapshot
        np.testing.assert_array_equal(
            np.subtract(img, np.float32(FILL_VALUE), dtype=np.float32), decode.prepare_image(path, 64)
        )
    # the EXIF-6 image is stored 80 wide, 40 high; decoded (and allocated) upright: 80 high
    assert snap.image(3).shape[:2] == (64, 32)
    assert snap.image(4).shape[:2] == (64, 26)


def test_snapshot_being_prepared_by_live_process_is_waited_for_then_refused(synthetic_data):
    import subprocess
    import sys

    from pixpool.shared.errors import SnapshotError

    dataset = load_dataset(synthetic_data.coco_json)
    base = base_name(fingerprint(dataset, imgsz=160))
    seg = SharedSegment.create(base + "-meta", 4096)  # incomplete: no header, no mark
    # The preparer is another process holding the segment as every pixpool mapping does
    # (shared.transport.holds); this process lets go of its own mapping once that one holds it.
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from pixpool.shared.transport.shm import SharedSegment; "
         "s = SharedSegment.attach(sys.argv[1]); "
         "print('mapped', flush=True); sys.stdin.read()", base + "-meta"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "mapped"  # returns when the child has mapped it (or died)
        seg.close()
        assert os.path.exists(DEFAULT.path(base + "-meta"))
        with pytest.raises(
            SnapshotError, match=rf"being prepared by live process\(es\) \[{holder.pid}\].*; waited 0.3 s"
        ):
            prepare_snapshot(dataset, PrepareOptions(imgsz=160, processes=1, prepare_wait_s=0.3))
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
        holder.stdout.close()
        seg.close()
        seg.unlink()


def test_header_size_mismatch_names_the_file(tmp_path, monkeypatch):
    paths = write_jpegs(tmp_path / "img", [(40, 60), (50, 30), (64, 64)])
    before = set(DEFAULT.segments())
    real = prepare.header_size_hw
    monkeypatch.setattr(prepare, "header_size_hw", lambda p: (41, 60) if p == paths[0] else real(p))
    with pytest.raises(ImageDecodeError, match="differs from the header size") as info:
        prepare_snapshot(dataset_of(paths), PrepareOptions(imgsz=64, processes=1))
    assert paths[0] in str(info.value)
    assert created_by_me(before) == []
