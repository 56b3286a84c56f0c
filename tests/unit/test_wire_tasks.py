"""Unit tests of what carries each task's targets (no processes): the ``attached`` reply's task
fields, the ring layout the daemon derives from a source's task, a worker's part written into
a ring, the frames reader, the trainer's batch types and the digest with masks."""

from __future__ import annotations

import hashlib
import os
from types import SimpleNamespace

import numpy as np
import pytest

from pixpool.client.delivery import FrameReader
from pixpool.client.tensors import Conversion, to_batch
from pixpool.server.daemon import admission
from pixpool.server.daemon.worker import _render_into
from pixpool.shared.errors import ConfigError, ProtocolError
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
from pixpool.shared.stream.digest import batch_digest
from pixpool.shared.task import task_spec
from pixpool.shared.transport.names import ring_segment
from pixpool.shared.transport.ring import Ring, RingLayout
from pixpool.shared.wire.trainer import PROTOCOL_VERSION, decode, encode_reply


# -- the attached reply --------------------------------------------------------------------
def _attached(**task) -> dict:
    return {
        "trainer_id": 1,
        "token": 2,
        "ring": "r",
        "layout": {},
        "num_records": 3,
        "imgsz": 64,
        "daemon_pid": 9,
        "host": "h",
        "store": "/dev/shm",
        **task,
    }


@pytest.mark.parametrize(
    "task",
    [
        {"task": "detect", "kpt_shape": None, "flip_idx": None},
        {"task": "segment", "kpt_shape": None, "flip_idx": None},
        {"task": "pose", "kpt_shape": [17, 3], "flip_idx": [0, 2, 1, *range(3, 17)]},
        {"task": "pose", "kpt_shape": [4, 2], "flip_idx": None},
        {"task": "obb", "kpt_shape": None, "flip_idx": None},
    ],
)
def test_attached_carries_the_task_and_its_keypoint_shape(task):
    back = decode(encode_reply("attached", **_attached(**task)), reply=True)
    assert {k: back[k] for k in task} == task


@pytest.mark.parametrize(
    "task, field, words",
    [
        ({"task": "depth", "kpt_shape": None, "flip_idx": None}, "task", "is not one of ['detect', 'segment'"),
        ({"task": "pose", "kpt_shape": None, "flip_idx": None}, "kpt_shape", "a pose task needs field 'kpt_shape'"),
        ({"task": "pose", "kpt_shape": [17, 4], "flip_idx": None}, "kpt_shape", "must be [K, 2 or 3]"),
        ({"task": "pose", "kpt_shape": [0, 3], "flip_idx": None}, "kpt_shape", "with 1 <= K <= 1024"),
        ({"task": "pose", "kpt_shape": [2, 3], "flip_idx": [1, 2]}, "flip_idx", "must be K = 2 integers from 0"),
        ({"task": "pose", "kpt_shape": [2, 3], "flip_idx": [1]}, "flip_idx", "must be K = 2 integers"),
        ({"task": "detect", "kpt_shape": None, "flip_idx": [0]}, "flip_idx", "with 'kpt_shape' given"),
        ({"task": "obb", "kpt_shape": "17,3", "flip_idx": None}, "kpt_shape", "must be nil or list, got str"),
    ],
)
def test_attached_refuses_a_task_field_out_of_bounds_on_both_sides(task, field, words):
    with pytest.raises(ProtocolError) as sent:
        encode_reply("attached", **_attached(**task))
    assert sent.value.field == field and words in str(sent.value)
    import msgpack

    frame = msgpack.packb(
        {"v": PROTOCOL_VERSION, "op": "attached", **_attached(**task)}, use_bin_type=True
    )  # what a broken daemon would send
    with pytest.raises(ProtocolError) as got:
        decode(frame, reply=True)
    assert got.value.field == field and words in str(got.value)


# -- the layout of a source's task -------------------------------------------------------------
def _source(task=None, kpt_shape=None, imgsz=160):
    # every source states its task; one built without a name here is a detect source
    return SimpleNamespace(imgsz=imgsz, max_instances=3, spec=task_spec(task or "detect", kpt_shape=kpt_shape))


def _stream(batch_size=4, **augment) -> StreamSettings:
    return StreamSettings(batch_size=batch_size, augment=AugmentConfig(imgsz=160, **augment))


@pytest.mark.parametrize(
    "source, want",
    [
        (_source(), {"target_width": 6}),  # a source that names no task: detect
        (_source("detect"), {"target_width": 6}),
        (_source("obb"), {"target_width": 7}),
        (_source("pose", (17, 3)), {"target_width": 57}),
        (_source("pose", (4, 2)), {"target_width": 18}),
        (_source("segment"), {"target_width": 6, "mask_side": 40, "mask_dtype": "uint8"}),
    ],
)
def test_task_layout_follows_the_sources_task(source, want):
    assert admission.task_layout(source, _stream(), max_targets=96) == want


def test_segment_planes_are_int32_once_a_sample_may_number_more_than_255():
    got = admission.task_layout(_source("segment"), _stream(batch_size=4, mask_ratio=2), max_targets=4 * 256)
    assert got == {"target_width": 6, "mask_side": 80, "mask_dtype": "int32"}


def test_segment_refuses_per_instance_planes_and_other_tasks_ignore_them():
    with pytest.raises(ConfigError) as info:
        admission.task_layout(_source("segment"), _stream(overlap_mask=False), max_targets=8)
    assert info.value.field == "overlap_mask"
    assert "one mask plane per image" in str(info.value) and "overlap_mask=True" in str(info.value)
    for task, kpt in (("detect", None), ("pose", (5, 3)), ("obb", None)):
        got = admission.task_layout(_source(task, kpt), _stream(overlap_mask=False, mask_ratio=32), max_targets=8)
        assert "mask_side" not in got


def test_a_pose_source_without_kpt_shape_is_a_config_error():
    with pytest.raises(ConfigError, match="the pose task needs kpt_shape") as info:
        admission.task_layout(_source("pose"), _stream(), max_targets=8)
    assert info.value.field == "task"


def test_ring_for_counts_the_mask_planes_in_the_ring_budget():
    from pixpool.shared.errors import CapacityError
    from pixpool.shared.stream.config import DaemonConfig

    renderer = SimpleNamespace(max_targets=lambda n, s: 4 * n * s.batch_size)
    msg = {"slots": 3, "delivery": "shm"}
    options = {
        "renderer": renderer,
        "rings_nbytes": 0,
        "ring_budget_nbytes": 1 << 40,
        "trainers": 0,
        "snapshot_nbytes": 0,
    }
    detect = admission.ring_for(msg, _stream(), source=_source(), config=DaemonConfig(data="x"), **options)
    segment = admission.ring_for(msg, _stream(), source=_source("segment"), config=DaemonConfig(data="x"), **options)
    # The planes sit between the rows and the samples: 4 planes of 40 x 40 more per slot.
    assert segment.masks_offset == detect.samples_offset and segment.masks_nbytes == 4 * 40 * 40
    assert segment.samples_offset == detect.samples_offset + 4 * 40 * 40 and segment.nbytes > detect.nbytes
    tight = DaemonConfig(data="x", max_ring_nbytes=detect.nbytes)
    admission.ring_for(msg, _stream(), source=_source(), config=tight, **options)
    with pytest.raises(CapacityError, match=r"48 target rows of 6 columns and 6400 bytes of mask planes per slot"):
        admission.ring_for(msg, _stream(), source=_source("segment"), config=tight, **options)


# -- a worker's part ---------------------------------------------------------------------------
@pytest.fixture
def make_ring(shm_name):
    made = []

    def make(**task) -> Ring:
        name = ring_segment(os.getpid(), f"9001{len(made)}")
        shm_name.own(name)
        made.append(Ring.create(name, RingLayout(slots=2, batch_size=4, imgsz=8, max_targets=8, **task)))
        return made[-1]

    yield make
    for r in made:
        r.close()


class _Route:
    """A renderer module's ``render_range``; ``masks`` is whether it takes ``masks_out`` at all."""

    def __init__(self, width: int, *, masks: bool):
        self.width, self.masks, self.calls = width, masks, []

    def render_range(self, source, settings, epoch, batch, start, stop, images_out, **extra):
        if not self.masks and extra:
            raise TypeError(f"render_range() got unexpected keyword arguments {sorted(extra)}")
        self.calls.append(extra)
        images_out[...] = 7
        if "masks_out" in extra:
            assert (extra["masks_out"] == 0).all()  # handed over as background
            extra["masks_out"][...] = np.arange(1, stop - start + 1).reshape(-1, 1, 1)
        counts = [1] * (stop - start)
        targets = np.tile(np.arange(self.width, dtype=np.float32), (stop - start, 1))
        return targets, counts, np.arange(start, stop)


_JOB = {"slot": 1, "size": 4, "start": 1, "stop": 3, "epoch": 0, "batch": 2}


def test_a_detect_worker_calls_the_route_as_always(make_ring):
    ring = make_ring()
    route = _Route(6, masks=False)  # today's signature: no masks_out
    assert _render_into(ring, route, None, None, _JOB) == [1, 1]
    assert route.calls == [{}]
    assert (ring.images(1)[1:3] == 7).all() and ring.sample_targets(1, 2, 1).shape == (1, 6)


def test_a_segment_worker_hands_the_route_zeroed_planes_and_copies_them_into_its_positions(make_ring):
    """The route draws into planes of the worker's own (a killed straggler duplicate never
    leaves the slot's planes half cleared); they land in the part's positions only."""
    ring = make_ring(mask_side=2, mask_dtype="int32")
    ring.masks(1)[...] = 9  # an earlier batch's planes
    route = _Route(6, masks=True)
    _render_into(ring, route, None, None, _JOB)
    given = route.calls[0]["masks_out"]
    assert given.shape == (2, 2, 2) and given.dtype == np.int32
    assert not np.shares_memory(given, ring.masks(1))
    assert ring.masks(1)[:, 0, 0].tolist() == [9, 1, 2, 9]  # its positions only; the others are other parts'


def test_a_worker_refuses_rows_of_another_width(make_ring):
    ring = make_ring(target_width=7)  # obb
    with pytest.raises(ValueError, match=r"target rows of shape \(2, 6\).*have 7 columns.*disagree on the task"):
        _render_into(ring, _Route(6, masks=False), None, None, _JOB)
    assert _render_into(ring, _Route(7, masks=False), None, None, _JOB) == [1, 1]
    np.testing.assert_array_equal(ring.sample_targets(1, 1, 1)[0], np.arange(7, dtype=np.float32))


# -- the trainer's side --------------------------------------------------------------------------
class _Frame:
    def __init__(self, array: np.ndarray):
        self.buffer = memoryview(np.ascontiguousarray(array).tobytes())


def _ready(size: int, n_targets: int) -> dict:
    return {"size": size, "n_targets": n_targets, "epoch": 0, "batch": 5, "slot": 0, "generation": 1}


def test_frames_carry_wide_rows_and_a_fourth_frame_of_planes():
    lay = RingLayout(slots=2, batch_size=3, imgsz=4, max_targets=6, target_width=9, mask_side=2, mask_dtype="int32")
    images = np.arange(2 * 3 * 16, dtype=np.uint8).reshape(2, 3, 4, 4)
    targets = np.arange(27, dtype=np.float32).reshape(3, 9)
    masks = np.arange(8, dtype=np.int32).reshape(2, 2, 2) * 1000
    frames = [_Frame(images), _Frame(targets), _Frame(np.array([4, 1], np.int64)), _Frame(masks)]
    got = FrameReader(lay).arrays(_ready(2, 3), frames)
    for a, b in zip(got, (images, targets, np.array([4, 1]), masks)):
        np.testing.assert_array_equal(a, b)
    assert got[3].dtype == np.int32
    with pytest.raises(ProtocolError, match=r"needs 4 data frames after 'ready' \(images, targets, samples, masks\)"):
        FrameReader(lay).arrays(_ready(2, 3), frames[:3])
    with pytest.raises(ProtocolError, match=r"3 target rows of 9 columns"):
        FrameReader(lay).arrays(_ready(2, 3), [frames[0], _Frame(targets[:, :6]), *frames[2:]])
    detect = RingLayout(slots=2, batch_size=3, imgsz=4, max_targets=6)
    rows6 = _Frame(targets[:, :6])
    got = FrameReader(detect).arrays(_ready(2, 3), [frames[0], rows6, frames[2]])
    assert got[1].shape == (3, 6) and got[3] is None


@pytest.mark.parametrize("zero_copy", [True, False])
def test_to_batch_hands_the_masks_over_the_way_of_the_images(zero_copy):
    images = np.zeros((2, 3, 4, 4), np.uint8)
    masks = np.ones((2, 2, 2), np.uint8)
    arrays = (images, np.zeros((1, 6), np.float32), np.array([3, 4]), masks)
    out = to_batch(arrays, {"epoch": 1, "batch": 2}, Conversion(as_torch=False, zero_copy=zero_copy), _stream())
    assert np.shares_memory(out.masks, masks) == zero_copy and np.shares_memory(out.images, images) == zero_copy
    torch = pytest.importorskip("torch")
    out = to_batch(arrays, {"epoch": 1, "batch": 2}, Conversion(as_torch=True, zero_copy=zero_copy), _stream())
    assert isinstance(out.masks, torch.Tensor) and out.masks.dtype == torch.uint8
    assert np.shares_memory(out.masks.numpy(), masks) == zero_copy
    none = to_batch(
        (*arrays[:3], None), {"epoch": 1, "batch": 2}, Conversion(as_torch=True, zero_copy=False), _stream()
    )
    assert none.masks is None


def test_a_loader_batch_keeps_its_masks_through_rebuilds():
    torch = pytest.importorskip("torch")
    import copy
    import pickle

    from pixpool.client.batch import Batch

    masks = torch.arange(8, dtype=torch.uint8).reshape(2, 2, 2)
    b = Batch(torch.zeros(2, 3, 4, 4), torch.zeros(1, 6), indices=np.array([0, 1]), epoch=0, batch=0, masks=masks)
    images, targets = b  # still two elements
    for rebuilt in (
        type(b)(*b),
        type(b)(list(b)),
        b._replace(targets=targets),
        copy.copy(b),
        pickle.loads(pickle.dumps(b)),
    ):
        assert torch.equal(rebuilt.masks, masks)
    assert "masks=Tensor(2, 2, 2)" in repr(b)
    assert Batch(images, targets).masks is None


# -- the digest ----------------------------------------------------------------------------------
def test_masks_enter_the_digest_only_when_given_and_by_their_values():
    images = np.arange(2 * 3 * 4 * 4, dtype=np.uint8).reshape(2, 3, 4, 4)
    targets = np.ones((2, 6), np.float32)
    planes = np.array([[[0, 1], [2, 0]], [[1, 1], [0, 0]]], np.uint8)
    plain = batch_digest(images, targets)
    # A detect digest does not move: the images' then the targets' shape and bytes, nothing after.
    h = hashlib.sha256()
    for a in (images, targets):
        h.update(repr(a.shape).encode())
        h.update(a.tobytes())
    assert plain == h.hexdigest() and batch_digest(images, targets, None) == plain
    with_masks = batch_digest(images, targets, planes)
    assert with_masks != plain
    assert batch_digest(images, targets, planes.astype(np.int32)) == with_masks  # the ring's int32 container
    changed = planes.copy()
    changed[1, 1, 1] = 2
    assert batch_digest(images, targets, changed) != with_masks
    wide = np.ones((2, 7), np.float32)  # an obb row's angle is in the digest
    wide2 = wide.copy()
    wide2[1, 6] = 0.5
    assert batch_digest(images, wide) != batch_digest(images, wide2)
    with pytest.raises(TypeError, match="mask planes must hold integers"):
        batch_digest(images, targets, planes.astype(np.float32))


# -- the daemon's renderer module over the route -----------------------------------------------------
def test_the_renderer_passes_masks_out_only_with_masks_and_keeps_the_planes(monkeypatch):
    """``server/daemon/renderer.py`` calls the route with ``masks_out`` only where the worker
    gave planes; planes the route returned elsewhere are copied in; a plane of another size
    is an error naming the mask side."""
    from pixpool.server.augment import batch as route
    from pixpool.server.daemon import renderer

    calls, returned_side = [], {}

    def fake_range(source, settings, epoch, batch, start, stop, *, images_out=None, **extra):
        calls.append(sorted(extra))
        masks = None
        if "masks_out" in extra:
            side = returned_side.get("side", extra["masks_out"].shape[-1])
            masks = np.full((stop - start, side, side), 3, np.uint8)  # not the worker's array
        return SimpleNamespace(
            images=images_out,
            targets=np.zeros((0, 6), np.float32),
            counts=[0] * (stop - start),
            samples=np.arange(start, stop),
            masks=masks,
        )

    monkeypatch.setattr(route, "render_range", fake_range)
    images = np.zeros((2, 3, 8, 8), np.uint8)
    renderer.render_range(None, None, 0, 0, 0, 2, images)
    planes = np.zeros((2, 2, 2), np.int32)
    renderer.render_range(None, None, 0, 0, 0, 2, images, planes)
    assert calls == [[], ["masks_out"]] and (planes == 3).all()
    returned_side["side"] = 4
    with pytest.raises(ValueError, match=r"masks of shape \(2, 4, 4\).*mask planes are \(2, 2, 2\).*mask_ratio"):
        renderer.render_range(None, None, 0, 0, 0, 2, images, planes)
