"""What serving a dataset will hold, worked out before anything is decoded: ``pixpool plan``, and the
daemon's check at start-up.

Runs in ``pixpool plan``'s process and in the daemon process (``daemon/run.py``), after the
splits are read (or re-attached on their label index) and before the first image is decoded.
Reads image headers only (``headers.header_sizes``, in parallel for a large set), and sizes
everything with the functions the daemon sizes it with: a snapshot with ``prepare._plan`` (the
same index rows, sections and arena bytes a preparation allocates), each segment in whole store
blocks with ``prepare._allocated_nbytes``, a trainer's rings with ``admission.ring_layout`` (the
layout an ``attach`` gets), the break-even with ``shared.break_even``. So the figures
here are the figures a preparation and an attach then produce; only the processes' own memory
(the daemon's, its workers') is not in them: that is measured once they run (``pixpool memory``).

A trainer here is ``pixpool train``'s (or ``pixpool yolo``'s) default: a training ring of
``DEFAULT_SLOTS`` batches at the daemon's imgsz, and, where a validation set is served, a
validation ring of the same slots at the rect side for a stride-32 model (672 at 640: Ultralytics'
rect validation batches). Against it, what that trainer would hold with Ultralytics'
``cache=ram``: every training and validation image resized to long side imgsz as uint8 HWC
(the snapshot index's ``h * w * 3``, its ``decoded`` bytes).

Room: the snapshots that are not in the store yet (one re-attached, or the same images as
another split, take nothing new) and N trainers' rings, each in whole blocks of the store,
against the store's free space (and, for a store in memory, available memory), as the
preparation's own check counts them (``prepare.check_capacity``). The daemon gives its rings
at most half of what is free once its snapshots are in (``admission.ring_budget``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

import psutil

from ...shared.break_even import break_even
from ...shared.errors import CapacityError, PixpoolError
from ...shared.stream.config import AugmentConfig, StreamSettings
from ...shared.task import DETECT
from ...shared.text import human_bytes
from ...shared.transport.ring import DEFAULT_SLOTS, RingLayout
from ...shared.transport.store import Store, free_nbytes, is_memory
from . import layout

log = logging.getLogger(__name__)

# The model stride a validation ring is sized for: Ultralytics' max(model stride, 32).
VAL_STRIDE = 32
# Sizes tried, largest first, when the asked imgsz does not fit (each a multiple of 32).
_SMALLER_IMGSZ = (1024, 960, 896, 832, 768, 640, 576, 512, 448, 384, 320, 256, 192, 128, 64)


@dataclass(frozen=True)
class SnapshotPlan:
    """One split's snapshot: its segment bytes (``sizes``: meta, tgt, img), what the same images
    take as a uint8 cache (``decoded_nbytes``), and ``existing``: the name of the complete
    snapshot already in the store that the daemon will re-attach (it needs no new room)."""

    split: str
    records: int
    instances: int
    max_instances: int
    imgsz: int
    dtype: str
    sizes: dict
    decoded_nbytes: int
    existing: str | None = None
    same_as: str | None = None  # another split whose snapshot this is (the same images)

    @property
    def nbytes(self) -> int:
        return sum(self.sizes.values())


@dataclass(frozen=True)
class ServePlan:
    """Every split's snapshot, one trainer's rings, and the store's room for ``trainers`` of them."""

    snapshots: dict  # split -> SnapshotPlan
    ring: RingLayout
    val_ring: RingLayout | None
    trainers: int
    store: Store
    memory: bool
    free_nbytes: int
    available_nbytes: int | None  # memory available (a store in memory), else None
    new_snapshot_nbytes: int  # in whole blocks, the snapshots not in the store yet
    ring_block_nbytes: int  # in whole blocks, one trainer's rings
    suggestions: tuple = field(default_factory=tuple)

    @property
    def snapshot_nbytes(self) -> int:
        """Bytes of every snapshot served (each once), whether new or re-attached."""
        return sum(p.nbytes for p in self.snapshots.values() if p.same_as is None)

    @property
    def rings_nbytes(self) -> int:
        """One trainer's rings: training and validation."""
        return self.ring.nbytes + (self.val_ring.nbytes if self.val_ring is not None else 0)

    @property
    def cache_nbytes(self) -> int:
        """What one trainer holds with a uint8 cache of its own (module docstring)."""
        return sum(p.decoded_nbytes for p in self.snapshots.values())

    @property
    def room_nbytes(self) -> int:
        """What the store can take now: its free space, and for a store in memory no more than
        the memory available."""
        return self.free_nbytes if self.available_nbytes is None else min(self.free_nbytes, self.available_nbytes)

    @property
    def needed_nbytes(self) -> int:
        """New snapshots and ``trainers`` trainers' rings, in whole store blocks."""
        return self.new_snapshot_nbytes + self.trainers * self.ring_block_nbytes

    @property
    def snapshots_fit(self) -> bool:
        return self.new_snapshot_nbytes <= self.room_nbytes

    @property
    def fits(self) -> bool:
        """The snapshots fit, and the trainers' rings fit the daemon's ring budget: half of what
        is free once the snapshots are in (``admission.ring_budget``)."""
        left = self.room_nbytes - self.new_snapshot_nbytes
        return self.snapshots_fit and self.trainers * self.ring_block_nbytes <= max(0, left) // 2

    @property
    def break_even(self) -> int | None:
        return break_even(self.snapshot_nbytes, self.rings_nbytes, self.cache_nbytes)

    def as_dict(self) -> dict:
        return {
            "snapshots": {
                split: {
                    "records": p.records,
                    "instances": p.instances,
                    "max_instances": p.max_instances,
                    "imgsz": p.imgsz,
                    "dtype": p.dtype,
                    "bytes": p.nbytes,
                    "segments": dict(p.sizes),
                    "decoded_bytes": p.decoded_nbytes,
                    "existing": p.existing,
                    "same_as": p.same_as,
                }
                for split, p in self.snapshots.items()
            },  # fmt: skip
            "snapshot_bytes": self.snapshot_nbytes,
            "ring_bytes": self.ring.nbytes,
            "val_ring_bytes": self.val_ring.nbytes if self.val_ring is not None else 0,
            "trainers": self.trainers,
            "cache_bytes_per_trainer": self.cache_nbytes,
            "caches_bytes": self.trainers * self.cache_nbytes,
            "pixpool_bytes": self.snapshot_nbytes + self.trainers * self.rings_nbytes,
            "break_even_trainers": self.break_even,
            "store": str(self.store),
            "memory": self.memory,
            "free_bytes": self.free_nbytes,
            "available_bytes": self.available_nbytes,
            "needed_bytes": self.needed_nbytes,
            "new_snapshot_bytes": self.new_snapshot_nbytes,
            "snapshots_fit": self.snapshots_fit,
            "fits": self.fits,
            "suggestions": list(self.suggestions),
        }


# -- sizing ---------------------------------------------------------------------------------------------
def read_header_sizes(datasets, *, processes: int = 1) -> dict[str, tuple[int, int]]:
    """Image path -> (h, w) after EXIF orientation, from the headers of the images of ``datasets``
    (each file once, however many splits list it)."""
    from .headers import header_sizes

    paths = list(dict.fromkeys(rec.image_path for ds in datasets for rec in ds.records))
    return dict(zip(paths, header_sizes(paths, processes=processes)))


def snapshot_plan(dataset, sizes_hw: dict, *, split: str, imgsz: int, dtype: str) -> SnapshotPlan:
    """The snapshot a preparation of ``dataset`` would allocate (``prepare._plan``, pure with every
    header given) and the uint8 bytes of its resized images."""
    from .prepare import _plan

    keypoints = dataset.spec.has_keypoints
    kpt_count = dataset.kpt_shape[0] if keypoints else 0
    flip_count = len(dataset.flip_idx) if keypoints and dataset.flip_idx is not None else 0
    itemsize = layout.DTYPE_CODES[layout.CODE_OF[dtype]].itemsize
    index, sections, sizes, max_inst = _plan(dataset.records, imgsz, itemsize, kpt_count, flip_count, sizes_hw)
    decoded = int((index["height"].astype("int64") * index["width"] * 3).sum())
    return SnapshotPlan(split, len(index), sections.instances, int(max_inst), imgsz, dtype, sizes, decoded)


def attached_plan(snap, split: str) -> SnapshotPlan:
    """The plan of a snapshot already attached (re-attached on its label index): its own sizes."""
    h = snap.header
    return SnapshotPlan(
        split, len(snap), int(h.instances), int(h.max_instances), snap.imgsz, snap.dtype, dict(snap.nbytes),
        int(snap.decoded_nbytes), existing=snap.name,
    )  # fmt: skip


def existing_name(dataset, store: Store, *, imgsz: int, dtype: str) -> str | None:
    """The complete snapshot of ``dataset`` at these settings already in ``store`` (the one a
    preparation would re-attach), or None."""
    from ...shared.transport.names import snapshot_parts
    from .fingerprint import fingerprint
    from .handle import read_header
    from .reuse import choose_base

    try:
        fp = fingerprint(dataset, imgsz=imgsz, dtype=dtype)
        base = choose_base(fp, store=store)
        header = read_header(snapshot_parts(base)["meta"], store)
    except (PixpoolError, OSError):
        return None
    return base if header.is_complete and header.fingerprint == fp else None


def trainer_rings(snapshots: dict, *, batch_size: int, val_batch_size: int, dataset) -> tuple:
    """(training ring, validation ring or None) of one default trainer (module docstring), by the
    layout an ``attach`` gets (``admission.ring_layout``)."""
    from ..daemon import renderer
    from ..daemon.admission import ring_layout

    def source(p: SnapshotPlan):
        return SimpleNamespace(imgsz=p.imgsz, max_instances=p.max_instances, spec=dataset.spec)

    train = snapshots["train"]
    settings = StreamSettings(batch_size=batch_size).for_imgsz(train.imgsz)
    ring = ring_layout(source(train), settings, slots=DEFAULT_SLOTS, renderer=renderer)
    val = snapshots.get("val")
    if val is None:
        return ring, None
    val_settings = StreamSettings(
        batch_size=val_batch_size, split="val", shuffle=False,
        augment=AugmentConfig(imgsz=val.imgsz, train_route=False, rect_stride=VAL_STRIDE),
    )  # fmt: skip
    return ring, ring_layout(source(val), val_settings, slots=DEFAULT_SLOTS, renderer=renderer)


def serve_plan(
    datasets: dict,
    sizes_hw: dict,
    *,
    imgsz: int,
    dtype: str,
    store: Store,
    trainers: int = 1,
    batch_size: int = 16,
    val_batch_size: int = 16,
    attached: dict | None = None,
    suggest: bool = True,
) -> ServePlan:
    """The plan of serving ``datasets`` (split -> Dataset read in full, ``sizes_hw`` their header
    sizes) beside ``attached`` (split -> a snapshot re-attached on its label index) from ``store``
    to ``trainers`` default trainers; ``suggest``: also work out the cheaper settings that fit."""
    from .prepare import _allocated_nbytes

    snapshots: dict = {}
    seen: dict = {}  # existing name or fingerprint-free identity (the record paths) -> split
    for split in ("train", "val"):
        if attached and split in attached:
            p = attached_plan(attached[split], split)
        elif split in datasets:
            ds = datasets[split]
            p = snapshot_plan(ds, sizes_hw, split=split, imgsz=imgsz, dtype=dtype)
            p = replace(p, existing=existing_name(ds, store, imgsz=imgsz, dtype=dtype))
        else:
            continue
        ident = p.existing or tuple(rec.image_path for rec in datasets[split].records)
        if split != "train" and ident in seen:
            p = replace(p, same_as=seen[ident])
        seen.setdefault(ident, split)
        snapshots[split] = p
    any_ds = datasets.get("train") or next(iter(datasets.values()), None)
    ring, val_ring = trainer_rings(
        snapshots, batch_size=batch_size, val_batch_size=val_batch_size, dataset=any_ds or _detect()
    )
    new = sum(_allocated_nbytes(p.sizes, store) for p in snapshots.values() if p.existing is None and p.same_as is None)
    rings = {"ring": ring.nbytes, **({"val": val_ring.nbytes} if val_ring is not None else {})}
    memory = is_memory(store)
    plan = ServePlan(
        snapshots, ring, val_ring, trainers, store, memory, free_nbytes(store),
        psutil.virtual_memory().available if memory else None, new, _allocated_nbytes(rings, store),
    )  # fmt: skip
    if suggest and not plan.fits:
        plan = replace(plan, suggestions=tuple(_suggestions(plan, datasets, sizes_hw, attached, batch_size, val_batch_size)))  # fmt: skip
    return plan


def _detect():
    return SimpleNamespace(spec=DETECT)


def _suggestions(plan: ServePlan, datasets, sizes_hw, attached, batch_size, val_batch_size) -> list[str]:
    """The flags that make ``plan`` fit, cheapest change first: uint8, a smaller imgsz, another store."""
    out = []
    train = plan.snapshots["train"]

    def again(**settings) -> ServePlan:
        kw = {"imgsz": train.imgsz, "dtype": train.dtype, **settings}
        return serve_plan(
            datasets, sizes_hw, store=plan.store, trainers=plan.trainers, batch_size=batch_size,
            val_batch_size=val_batch_size, attached=attached, suggest=False, **kw,
        )  # fmt: skip

    if not datasets:
        return [f"--store DIR: a store with more room than {plan.store}"]
    if train.dtype == "float32":
        cheaper = again(dtype="uint8")
        if cheaper.fits:
            out.append(f"--dtype uint8 (needs {human_bytes(cheaper.needed_nbytes)})")
    for size in _SMALLER_IMGSZ:
        if size >= train.imgsz:
            continue
        smaller = again(imgsz=size, dtype="uint8")
        if smaller.fits:
            flags = f"--imgsz {size}" + (" --dtype uint8" if train.dtype == "float32" else "")
            out.append(f"{flags} (needs {human_bytes(smaller.needed_nbytes)})")
            break
    where = (
        "a folder on a local disk (the page cache holds what fits in memory)"
        if plan.memory
        else "a store with more room"
    )
    out.append(f"--store DIR: {where}")
    return out


# -- saying it ------------------------------------------------------------------------------------------
def _snapshot_words(p: SnapshotPlan) -> str:
    state = f", in the store already ({p.existing})" if p.existing else ""
    return f"{p.records} records, {p.dtype} at {p.imgsz} px: {human_bytes(p.nbytes)}{state}"


def plan_line(plan: ServePlan) -> str:
    """The one line the daemon logs at start-up (``pixpool plan`` says it at length)."""
    snaps = "; ".join(
        f"{split} {_snapshot_words(p)}" if p.same_as is None else f"{split}: the {p.same_as} snapshot"
        for split, p in plan.snapshots.items()
    )
    val = f" + validation {human_bytes(plan.val_ring.nbytes)}" if plan.val_ring is not None else ""
    verdict = "fits" if plan.fits else ("the rings do not fit beside it" if plan.snapshots_fit else "does NOT fit")
    return (
        f"plan: snapshot {snaps}; a trainer's rings {human_bytes(plan.ring.nbytes)}{val}, its uint8 cache "
        f"{human_bytes(plan.cache_nbytes)}; needs {human_bytes(plan.needed_nbytes)} new in {plan.store} "
        f"({human_bytes(plan.room_nbytes)} free): {verdict}"
    )


def format_plan(plan: ServePlan, data: str) -> str:
    """``pixpool plan``'s text: every figure, the verdict and what to change."""
    lines = [f"plan for {data} (nothing decoded; sizes from the image headers):"]
    for split, p in plan.snapshots.items():
        name = "training" if split == "train" else "validation"
        if p.same_as is not None:
            lines.append(f"  {name} snapshot: the {p.same_as} snapshot (the same images)")
            continue
        lines.append(f"  {name} snapshot: {_snapshot_words(p)} ({p.instances} instances)")
        lines.append(
            f"    images {human_bytes(p.sizes['img'])}, index {human_bytes(p.sizes['meta'])}, "
            f"targets {human_bytes(p.sizes['tgt'])}; as a uint8 cache {human_bytes(p.decoded_nbytes)}"
        )
    r = plan.ring
    lines.append(
        f"  a trainer's training ring: {r.slots} slots of batch {r.batch_size} at {r.imgsz} px: {human_bytes(r.nbytes)}"
    )
    if plan.val_ring is not None:
        v = plan.val_ring
        lines.append(
            f"  its validation ring: {v.slots} slots of batch {v.batch_size} at {v.imgsz} px (rect, stride "
            f"{VAL_STRIDE}): {human_bytes(v.nbytes)}"
        )
    n = plan.trainers
    lines.append(
        f"  {n} trainer(s): pixpool holds {human_bytes(plan.snapshot_nbytes + n * plan.rings_nbytes)} "
        f"(snapshots + {n} x rings); {n} uint8 cache(s) (Ultralytics cache=ram, train + val) "
        f"{human_bytes(n * plan.cache_nbytes)}"
    )
    be = plan.break_even
    lines.append(
        f"  break-even: from {be} trainer(s) on, pixpool holds less than their uint8 caches"
        if be is not None
        else "  break-even: never (a trainer's rings take more than its uint8 cache would)"
    )
    mem = f", {human_bytes(plan.available_nbytes)} memory available" if plan.available_nbytes is not None else ""
    lines.append(
        f"  store {plan.store}{' (memory)' if plan.memory else ''}: {human_bytes(plan.free_nbytes)} free{mem}; "
        f"needs {human_bytes(plan.new_snapshot_nbytes)} for new snapshots + {n} x "
        f"{human_bytes(plan.ring_block_nbytes)} for rings = {human_bytes(plan.needed_nbytes)}"
    )
    if plan.fits:
        lines.append(
            "  fits: the rings within the daemon's ring budget (half the space left once the snapshots are in)"
        )
    else:
        what = (
            "the rings do not fit the daemon's ring budget beside the snapshots"
            if plan.snapshots_fit
            else "does NOT fit"
        )
        lines.append(f"  {what}; " + ("try " + "; or ".join(plan.suggestions) if plan.suggestions else ""))
    return "\n".join(lines)


def check_room(plan: ServePlan) -> None:
    """CapacityError when the snapshots not in the store yet do not fit it: naming the store, the
    bytes needed and free, and the flags that help. Before anything is decoded or allocated."""
    if plan.snapshots_fit:
        return
    mem = (
        f" and {plan.available_nbytes} bytes of memory are available"
        if plan.available_nbytes is not None and plan.available_nbytes < plan.free_nbytes
        else ""
    )
    helps = "; ".join(plan.suggestions) or f"--store DIR with more room than {plan.store}"
    raise CapacityError(
        f"the snapshot(s) need {plan.new_snapshot_nbytes} bytes but the store {plan.store} has {plan.free_nbytes} "
        f"bytes free{mem}; nothing was decoded. Try {helps}; or remove old snapshots (`pixpool clean`)"
        + ("; or serve no validation set (--no-val)" if "val" in plan.snapshots else "")
    )
