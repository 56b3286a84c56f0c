"""Values from a label file are bounded before they cost anything.

Unit tests: readers and message encoding in the pytest process, nothing started.

- A class id is bounded by ``--max-classes``: an images folder read without names turned
  its largest id into that many names, so one line with class id 1,000,000 made a 6.9 MB
  ``attached`` reply no trainer accepts, and 999,999,999 a MemoryError at 3.5 GB. Class
  names (a data.yaml's ``names``, a COCO json's categories) have the same bound, and
  together a byte bound that keeps every reply carrying them under the frame limit.
- A label file is read line by line and refused at the first instance over
  ``--max-instances-per-image``: memory follows the bound, not the file (a 1M-line file
  was parsed whole: 21 s and 644 MB). One line is bounded too (``MAX_LINE_CHARS``,
  ``MAX_LINE_FIELDS``: twice a 2M-point polygon), and a long one is split piece by piece.
- No reply exceeds ``MAX_REPLY_BYTES``: ``encode_reply`` refuses one, an ``error`` reply is
  cut to fit, and the replies that grow with the dataset (class names, a records page) are
  bounded.

Memory is measured with ``tracemalloc`` (numpy reports its buffers to it too).
"""

from __future__ import annotations

import json
import time
import tracemalloc
from pathlib import Path

import msgpack
import numpy as np
import pytest

from pixpool.server.readers import load_dataset, read_dataset, yolo_labels
from pixpool.shared.errors import ConfigError, DatasetError, ProtocolError
from pixpool.shared.stream import config
from pixpool.shared.stream.config import MAX_CLASSES, DaemonConfig
from pixpool.shared.task import task_spec
from pixpool.shared.wire.error_codes import MAX_ERROR_CHARS, error_frame
from pixpool.shared.wire.trainer import (
    MAX_NAMES_BYTES,
    MAX_REPLY_BYTES,
    RECORDS_PAGE_BYTES,
    Op,
    decode,
    encode_reply,
    names_nbytes,
)

# A reader's working memory with the default bound of 1000 instances: far below what a
# 1M-line label file cost when it was read whole (644 MB measured in the issue).
READ_PEAK_LIMIT_BYTES = 32 << 20


@pytest.fixture
def ds(synthetic_copy) -> Path:
    return synthetic_copy


def _folder(ds: Path) -> Path:
    return ds / "images" / "train"


def _label(ds: Path, name: str = "synth_0004.txt") -> Path:
    return ds / "labels" / "train" / name


def _peak_of(fn):
    """(result or exception, peak bytes traced) of ``fn()``."""
    tracemalloc.start()
    try:
        try:
            out = fn()
        except DatasetError as exc:  # the refusal is what the caller checks
            out = exc
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# ---- class ids -----------------------------------------------------------------------------


def test_folder_class_id_over_max_classes_is_refused_by_file_and_line(ds):
    label = _label(ds)
    label.write_text("0 0.5 0.5 0.2 0.2\n1000000 0.5 0.5 0.1 0.1\n")
    with pytest.raises(DatasetError) as info:
        load_dataset(_folder(ds))
    err = info.value
    assert (err.path, err.line) == (str(label), 2), str(err)
    assert (
        "class id 1000000" in str(err) and f"{config.DEFAULT_MAX_CLASSES}" in str(err) and "--max-classes" in str(err)
    )


def test_folder_huge_class_id_is_refused_in_bounded_memory(ds):
    """999,999,999 once built a billion names (MemoryError at 3.5 GB)."""
    _label(ds).write_text("999999999 0.5 0.5 0.1 0.1\n")
    err, peak = _peak_of(lambda: load_dataset(_folder(ds)))
    assert isinstance(err, DatasetError) and err.line == 1, repr(err)
    assert peak < READ_PEAK_LIMIT_BYTES, f"refusing one class id took {peak / 1e6:.1f} MB"


def test_folder_class_ids_under_the_bound_still_name_every_class(ds):
    _label(ds).write_text("499 0.5 0.5 0.1 0.1\n")
    assert len(read_dataset(_folder(ds), max_classes=500)[0].names) == 500
    with pytest.raises(DatasetError, match=r"class id 500 .*--max-classes"):
        _label(ds).write_text("500 0.5 0.5 0.1 0.1\n")
        read_dataset(_folder(ds), max_classes=500)


def test_max_classes_is_a_daemon_setting_with_a_flag_and_a_range():
    from helpers.commands import parse_pixpool

    assert DaemonConfig(data="x").max_classes == config.DEFAULT_MAX_CLASSES
    with pytest.raises(ConfigError, match="max_classes"):
        DaemonConfig(data="x", max_classes=0)
    with pytest.raises(ConfigError, match="max_classes"):
        DaemonConfig(data="x", max_classes=MAX_CLASSES + 1)
    args = parse_pixpool(["pixpool", "serve", "data.yaml", "--max-classes", "123"])
    assert args.max_classes == 123


def test_yaml_names_over_max_classes_are_refused_naming_the_yaml(ds):
    yaml_path = ds / "data.yaml"
    text = yaml_path.read_text()
    names = "[" + ", ".join(f"c{i}" for i in range(600)) + "]"
    yaml_path.write_text(
        "\n".join(line for line in text.splitlines() if not line.startswith(("names", "nc", " ")))
        + f"\nnames: {names}\n"
    )
    assert len(load_dataset(yaml_path).names) == 600
    with pytest.raises(DatasetError) as info:
        read_dataset(yaml_path, max_classes=599)
    assert info.value.path == str(yaml_path) and "600 classes" in str(info.value) and "--max-classes" in str(info.value)


def test_coco_categories_over_max_classes_are_refused_naming_the_json(ds):
    path = ds / "annotations" / "instances_train.json"
    data = json.loads(path.read_text())
    top = max(c["id"] for c in data["categories"])
    data["categories"] += [{"id": top + 1 + i, "name": f"extra{i}"} for i in range(50)]
    path.write_text(json.dumps(data))
    n = len(data["categories"])
    assert len(load_dataset(path).names) == n
    with pytest.raises(DatasetError) as info:
        read_dataset(path, max_classes=n - 1)
    assert info.value.path == str(path) and f"{n} classes" in str(info.value) and "--max-classes" in str(info.value)


def test_class_names_too_long_for_a_reply_are_refused(ds):
    yaml_path = ds / "data.yaml"
    text = yaml_path.read_text()
    long = "n" * 4000
    names = "[" + ", ".join(f"{long}{i}" for i in range(400)) + "]"  # 1.6 MB of names
    yaml_path.write_text(
        "\n".join(line for line in text.splitlines() if not line.startswith(("names", "nc", " ")))
        + f"\nnames: {names}\n"
    )
    with pytest.raises(DatasetError) as info:
        load_dataset(yaml_path)
    assert info.value.path == str(yaml_path) and f"{MAX_NAMES_BYTES}" in str(info.value), str(info.value)


# ---- instances and lines -------------------------------------------------------------------


def test_label_file_over_the_instance_bound_is_refused_at_the_first_line_over_it(ds):
    """The issue's 1M-line file: refused at line 1001 with the default bound, in bounded
    memory (before: parsed whole, 21 s and 644 MB, then refused)."""
    label = _label(ds)
    label.write_bytes(b"0 0.5 0.5 0.1 0.1\n" * 1_000_000)
    t0 = time.perf_counter()
    err, peak = _peak_of(lambda: load_dataset(ds / "data.yaml"))
    seconds = time.perf_counter() - t0
    assert isinstance(err, DatasetError), repr(err)
    assert (err.path, err.line) == (str(label), 1001), str(err)
    assert "more than 1000 instances" in str(err) and "--max-instances-per-image" in str(err)
    assert peak < READ_PEAK_LIMIT_BYTES, f"refusing the file took {peak / 1e6:.1f} MB ({seconds:.1f} s)"


def test_the_instance_bound_counts_instances_not_lines(ds):
    """Blank lines and boxes dropped as degenerate are not instances: a file of 3 under a
    bound of 3 reads, whatever else it holds."""
    label = _label(ds)
    label.write_text(
        "\n\n0 0.5 0.5 0.1 0.1\n0 0.5 0.5 0 0.1\n0 0.4 0.4 0.1 0.1\n\n0 0.5 0.5 0.1 0\n0 0.3 0.3 0.1 0.1\n"
    )
    counts = [r.num_instances for r in load_dataset(ds / "data.yaml", max_instances_per_image=6).records]
    assert 3 in counts
    with pytest.raises(DatasetError) as info:
        load_dataset(ds / "data.yaml", max_instances_per_image=2)
    assert (info.value.path, info.value.line) == (str(label), 8), str(info.value)


def test_a_line_over_the_line_bound_is_refused_by_file_and_line(ds, monkeypatch):
    monkeypatch.setattr(yolo_labels, "MAX_LINE_CHARS", 1000)
    label = _label(ds)
    label.write_text("0 0.5 0.5 0.1 0.1\n0" + " 0.5" * 600 + "\n")
    with pytest.raises(DatasetError) as info:
        load_dataset(ds / "data.yaml")
    assert (info.value.path, info.value.line) == (str(label), 2), str(info.value)
    assert "1000 characters" in str(info.value)


def test_a_line_over_the_field_bound_is_refused_by_file_and_line(tmp_path, monkeypatch):
    monkeypatch.setattr(yolo_labels, "MAX_LINE_FIELDS", 9)
    path = tmp_path / "a.txt"
    path.write_text("0 0.1 0.1 0.9 0.1 0.9 0.9 0.1 0.9\n0" + " 0.5" * 10 + "\n")
    with pytest.raises(DatasetError) as info:
        yolo_labels.parse_label_file(path, None, task=task_spec("segment"))
    assert info.value.line == 2 and "11 fields, over the limit of 9" in str(info.value), str(info.value)


@pytest.mark.parametrize("piece_chars", [1, 2, 3, 7, 64])
def test_a_long_line_split_in_pieces_gives_the_fields_of_one_split(monkeypatch, piece_chars):
    """Pieces are cut at whitespace only (str.isspace, Unicode included), so no field is cut."""
    monkeypatch.setattr(yolo_labels, "_PIECE_CHARS", piece_chars)
    rng = np.random.default_rng(piece_chars)
    spaces = [" ", "  ", "\t", "\u3000", "\xa0", "\x1f", " \u2003 "]
    for _ in range(50):
        words = [f"{rng.random():.{int(rng.integers(0, 9))}g}" for _ in range(int(rng.integers(1, 40)))]
        line = "".join(str(rng.choice(spaces)) + w for w in words) + str(rng.choice(spaces))
        n, fields = yolo_labels._split(line)
        assert (n, list(fields)) == (len(line.split()), line.split()), repr(line)


def test_a_line_without_newline_at_the_bound_reads(tmp_path, monkeypatch):
    monkeypatch.setattr(yolo_labels, "MAX_LINE_CHARS", 17)
    path = tmp_path / "a.txt"
    path.write_text("0 0.5 0.5 0.1 0.1")  # 17 characters, no newline
    assert len(yolo_labels.parse_label_file(path, None)[0]) == 1
    path.write_text("0 0.5 0.5 0.1 0.1\n1 0.5 0.5 0.1 0.1\n")
    assert len(yolo_labels.parse_label_file(path, None)[0]) == 2


def test_other_line_breaks_still_split_lines_as_before(tmp_path):
    """``str.splitlines`` breaks (\\r, \\v, \\x1c, U+2028 ...) still end a line, so line numbers
    and what a line holds are those of the reader before it streamed."""
    path = tmp_path / "a.txt"
    path.write_bytes("0 0.5 0.5 0.1 0.1\r1 0.5 0.5 0.1 0.1\x0b2 0.5 0.5 0.1 0.1\u20283 0.5 0.5 0.1 0.1\r\n".encode())
    assert yolo_labels.parse_label_file(path, None)[0] == [0, 1, 2, 3]
    path.write_bytes(b"0 0.5 0.5 0.1 0.1\x0c0 0.5 0.5 0.1 x\n")
    with pytest.raises(DatasetError) as info:
        yolo_labels.parse_label_file(path, None)
    assert info.value.line == 2


def test_a_2m_point_polygon_still_reads(tmp_path):
    """The issue's 2M-point polygon (written as Ultralytics writes coordinates, %g) stays
    under the line bound and reads."""
    k = 2_000_000
    t = np.linspace(0, 2 * np.pi, k, endpoint=False)
    pts = np.stack([0.5 + 0.4 * np.cos(t), 0.5 + 0.4 * np.sin(t)], axis=1)
    line = "0 " + " ".join(f"{v:g}" for v in pts.reshape(-1)) + "\n"
    assert len(line) < yolo_labels.MAX_LINE_CHARS
    path = tmp_path / "poly.txt"
    path.write_text(line)
    del line
    classes, _, polygons, _, dropped = yolo_labels.parse_label_file(path, 1, task=task_spec("segment"), max_instances=1)
    assert classes == [0] and dropped == 0 and polygons[0].shape == (k, 2)


def test_invalid_utf8_is_still_named(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(b"0 0.5 0.5 0.1 0.1\n\xff\xfe\n")
    with pytest.raises(DatasetError, match="not UTF-8"):
        yolo_labels.parse_label_file(path, None)


# ---- replies -------------------------------------------------------------------------------


def test_encode_reply_refuses_a_reply_over_the_frame_limit():
    names = [f"{i:07d}" for i in range(1_000_000)]  # the attach: 6.9 MB of names
    with pytest.raises(ProtocolError) as info:
        encode_reply(Op.RECORDS, start=0, total=1, files=[], names=names)
    assert "records" in str(info.value) and f"{MAX_REPLY_BYTES}" in str(info.value)


def test_an_error_reply_is_cut_to_fit_never_refused():
    """The daemon's error path sends whatever an exception says: it must not fail on size."""
    frame = error_frame("internal", "x" * (8 << 20), field="f" * (8 << 20))
    msg = decode(frame, reply=True)
    assert len(msg["message"]) < MAX_ERROR_CHARS + 100 and f"of {8 << 20} characters" in msg["message"]
    assert len(msg["field"]) == MAX_ERROR_CHARS


def test_the_largest_class_list_fits_every_reply_that_carries_it():
    """An images folder at the largest ``--max-classes`` names "0".."N-1": those names, or any
    names under ``MAX_NAMES_BYTES``, fit an ``attached`` and a full ``records`` reply."""
    names = [str(i) for i in range(MAX_CLASSES)]
    assert names_nbytes(names) <= MAX_NAMES_BYTES
    attached = encode_reply(
        Op.ATTACHED, trainer_id=1, token=2, ring="r" * 255, layout={"slots": 4, "x": "y" * 1000}, num_records=1,
        imgsz=640, daemon_pid=1, host="h" * 255, names=names, task="detect", kpt_shape=None, flip_idx=None,
        store="/s" * 2000, pid_ns="pid:[1]", snapshot={"fingerprint": "f" * 64, "name": "n" * 255, "records": 1},
    )  # fmt: skip
    assert len(attached) < MAX_REPLY_BYTES
    packed = b"p" * RECORDS_PAGE_BYTES
    reply = encode_reply(Op.RECORDS, start=0, total=1, files=[], names=names, packed=packed, count=1)
    assert len(reply) < MAX_REPLY_BYTES


def test_a_records_list_page_of_long_paths_stays_under_the_reply_limit(monkeypatch):
    """A trainer of an earlier release asks for lists of ``RECORDS_PAGE`` names: 2000 paths
    of 4000 bytes were 8 MB. The page now also stops at ``RECORDS_PAGE_BYTES``."""
    from types import SimpleNamespace

    from pixpool.server.daemon import service
    from pixpool.shared.stream.path_table import PathTable

    paths = [f"/{i:04d}" + "d" * 3990 + ".jpg" for i in range(2500)]
    sent = []
    monkeypatch.setattr(service.delivery, "send", lambda sock, identity, frame: sent.append(frame))
    daemon = SimpleNamespace(files={"train": PathTable.from_paths(paths)}, names=["a"])
    got, start = [], 0
    while start < len(paths):
        service.Daemon._on_records(daemon, None, SimpleNamespace(identity=b"i"), {"start": start})
        assert len(sent[-1]) < MAX_REPLY_BYTES
        page = decode(sent[-1], reply=True)["files"]
        assert page, "an empty page"
        got += page
        start += len(page)
    assert got == paths
    assert msgpack.unpackb(sent[0], raw=False)["total"] == len(paths)
