"""Admission: what a trainer's ``attach`` gets, or why it is refused.

Runs in the daemon process, in its loop (``service.py``).

- ``check_quota``: how many sessions one client (a uid, or a CURVE key) may hold.
- ``ring_for`` decides an ``attach``: the trainer's settings (at the snapshot's imgsz) and the
  ring's bytes against the budgets
  (per ring, all rings, and the memory budget of snapshot plus rings). A refusal is an
  ``error`` reply to that trainer only; the others are served on.
- ``task_layout``: what the served task puts in a ring (its ``TaskSpec``, ``shared/task.py``): the
  target row width and, for segment, the mask plane (side, dtype), all counted in the
  ring's bytes above.
- ``ring_budget``: what all rings together may take (``--max-total-ring-nbytes``, else
  ``default_ring_budget``: half of the store's free space at start), and where that came from.

Where the daemon listens is ``listener.py``; the checks before it starts ``preflight.py``;
the sweep of dead daemons' rings ``sweeps.py``; the store's free space ``store_watch.py``.
"""

from __future__ import annotations

import dataclasses

from ...shared.errors import CapacityError, ConfigError
from ...shared.stream.config import DaemonConfig, StreamSettings
from ...shared.stream.flags import flag_of
from ...shared.stream.rect_plan import slot_side
from ...shared.stream.route import Route
from ...shared.transport.ring import MAX_SLOTS, MIN_SLOTS, RingLayout, mask_dtype_for
from ...shared.transport.store import DEFAULT, Store, free_nbytes
from ...shared.wire.trainer import DELIVERIES, DELIVERY_FRAMES, DELIVERY_SHM

__all__ = [
    "check_quota",
    "default_ring_budget",
    "ring_budget",
    "ring_for",
    "ring_layout",
    "task_layout",
]


def _raise(field: str) -> str:
    """The words for raising a daemon limit, field and flag: ``raise max_trainers (pixpool serve
    --max-trainers)``. The refusal reaches the trainer, whose user started the daemon with the
    flag, or with the field from Python."""
    flag = next(flag_of(f) for f in dataclasses.fields(DaemonConfig) if f.name == field)
    return f"raise {field} (pixpool serve {flag})"


def check_quota(config: DaemonConfig, client: str, held: int) -> None:
    """CapacityError when ``client`` already holds its share of sessions (``held``)."""
    if client and held >= config.max_trainers_per_client:
        who = f"CURVE key {client[4:]}" if client.startswith("key:") else f"uid {client[4:]}"
        raise CapacityError(
            f"{who} already has {held} trainers attached, the daemon's limit per client "
            f"(max_trainers_per_client = {config.max_trainers_per_client}); detach one of them "
            f"or {_raise('max_trainers_per_client')}"
        )


def ring_for(
    msg: dict,
    settings: StreamSettings,
    *,
    source,
    renderer,
    config: DaemonConfig,
    rings_nbytes: int,
    ring_budget_nbytes: int,
    trainers: int,
    snapshot_nbytes: int,
    ring_budget_from: str = "",
) -> RingLayout:
    """The ring an ``attach`` gets, or ConfigError/CapacityError saying what to change.

    ``settings`` are already at the snapshot's imgsz (``StreamSettings.for_imgsz``, which
    refused a trainer asking for another): the ring is sized by ``source.imgsz``.
    ``ring_budget_from``: where ``ring_budget_nbytes`` came from (``ring_budget``), said in a refusal."""
    slots = msg["slots"]
    if not MIN_SLOTS <= slots <= MAX_SLOTS:
        raise ConfigError(
            f"slots {slots} is out of range; use {MIN_SLOTS} to {MAX_SLOTS} (all workers render into one slot together, so {MAX_SLOTS} keep a trainer fed whatever the worker count)",
            field="slots",
        )
    if msg["delivery"] not in DELIVERIES:
        raise ConfigError(
            f"delivery {msg['delivery']!r}: use {DELIVERY_SHM!r} (same machine) or {DELIVERY_FRAMES!r} (TCP)"
        )
    layout = ring_layout(source, settings, slots=slots, renderer=renderer)
    max_t = layout.max_targets
    if layout.nbytes > config.max_ring_nbytes:
        masks = f" and {layout.masks_nbytes} bytes of mask planes" if layout.has_masks else ""
        raise CapacityError(
            f"a ring of {slots} slots for batch {settings.batch_size} at imgsz {source.imgsz} needs {layout.nbytes} bytes "
            f"({max_t} target rows of {layout.target_width} columns{masks} per slot: "
            f"the snapshot's densest image has {source.max_instances} instances), "
            f"over the daemon's limit of {config.max_ring_nbytes}; use fewer slots or a smaller batch, fix that image's labels, or {_raise('max_ring_nbytes')}"
        )
    if rings_nbytes + layout.nbytes > ring_budget_nbytes:
        raise CapacityError(
            f"{_which_ring(settings, layout)} of {layout.nbytes} bytes on top of the {rings_nbytes} bytes of attached "
            f"trainers' rings exceeds the daemon's ring budget of {ring_budget_nbytes} bytes "
            f"({ring_budget_from or 'set by --max-total-ring-nbytes'}); {_ring_help(settings, config)}"
        )
    budget = config.memory_budget_nbytes
    if budget is not None and snapshot_nbytes + rings_nbytes + layout.nbytes > budget:
        raise CapacityError(
            f"{_which_ring(settings, layout)} of {layout.nbytes} bytes on top of the snapshot's {snapshot_nbytes} and the attached trainers' {rings_nbytes} bytes "
            f"exceeds the daemon's memory budget of {budget} bytes (in use {snapshot_nbytes + rings_nbytes}); "
            "use fewer slots or a smaller batch, detach a trainer, or raise the budget (--memory-budget)"
        )
    if trainers >= config.max_trainers:
        raise CapacityError(
            f"{trainers} trainers are attached, the daemon's limit; detach one or {_raise('max_trainers')}"
        )
    return layout


def ring_layout(source, settings: StreamSettings, *, slots: int, renderer) -> RingLayout:
    """The layout of a ring of ``slots`` for a stream of ``settings`` (at the snapshot's imgsz) on
    ``source`` (its ``imgsz``, ``max_instances`` and task): what ``ring_for`` admits or refuses, and
    what ``pixpool plan`` and the daemon's check at start-up (``server/snapshot/planning.py``) count
    for a trainer, from the same rules. ``renderer``: the module whose ``max_targets`` bounds a
    batch's target rows (``renderer.py``)."""
    max_t = max(1, renderer.max_targets(source.max_instances, settings))
    per_task = task_layout(source, settings, max_targets=max_t)
    return RingLayout(
        slots=slots, batch_size=settings.batch_size, imgsz=ring_side(source, settings), max_targets=max_t, **per_task
    )


def _which_ring(settings: StreamSettings, layout: RingLayout) -> str:
    """A refusal names the ring: a trainer's validation ring (batch 16 at the rect side, by
    default) is larger than its training ring and is asked for after it, at the first pass."""
    what = "the validation ring" if settings.split == "val" else "the training ring"
    return f"{what} ({layout.slots} slots of batch {settings.batch_size} at {layout.imgsz} px)"


def _ring_help(settings: StreamSettings, config: DaemonConfig) -> str:
    """The changes that let the ring fit, the trainer's first (``pixpool train`` flags), then the daemon's."""
    if settings.split == "val":
        trainer = "validate in smaller batches (pixpool train --val-batch-size) or not at all (--val 0)"
    else:
        trainer = "use a smaller batch (pixpool train --batch-size) or fewer slots"
    cheaper = ", a snapshot of a quarter of the bytes (--dtype uint8)" if config.dtype == "float32" else ""
    return (
        f"{trainer}; or start the daemon with more room: a store with more free space (--store DIR){cheaper}, "
        f"or {_raise('max_total_ring_nbytes')}"
    )


def ring_side(source, settings: StreamSettings) -> int:
    """The square side of a slot's images: the snapshot's imgsz, or for rect validation batches
    the largest batch shape (``shared/stream/rect_plan.py``), which can exceed it (672 at 640)."""
    cfg = settings.augment
    return slot_side(source.imgsz, cfg.rect_stride) if cfg.route is Route.RECT_VAL else source.imgsz


def task_layout(source, settings: StreamSettings, *, max_targets: int) -> dict:
    """The ring layout fields of the source's task: ``target_width`` and, for segment,
    ``mask_side`` and ``mask_dtype`` (int32 where a sample may number more than 255 instances).

    A segment stream must keep ``overlap_mask`` (Ultralytics' default): a ring slot is fixed
    in size, and one plane per instance would need a slot sized for the densest batch's
    instance count times the plane. The other tasks ignore the mask settings."""
    spec = source.spec
    try:
        width = spec.target_width()
    except ValueError as exc:
        raise ConfigError(f"the served dataset's task cannot be carried in a ring: {exc}", field="task") from None
    if not spec.has_masks:
        return {"target_width": width}
    aug = settings.augment
    if not aug.overlap_mask:
        raise ConfigError.for_field(
            "overlap_mask",
            aug.overlap_mask,
            "is refused by a segment daemon: its ring slots hold one mask plane per image (instances numbered "
            "1..n, Ultralytics' default overlap layout), and one plane per instance does not fit a fixed slot; "
            "train with overlap_mask=True, or render in process (pixpool.server.augment) for per-instance planes",
        )
    side = spec.mask_side(ring_side(source, settings), aug.mask_ratio)
    if side < 1:
        raise ConfigError.for_field(
            "mask_ratio", aug.mask_ratio, f"leaves no mask pixel at imgsz {source.imgsz}; use a mask_ratio <= imgsz"
        )
    per_sample = -(-max_targets // settings.batch_size)
    return {"target_width": width, "mask_side": side, "mask_dtype": mask_dtype_for(per_sample)}


def default_ring_budget(store: Store = DEFAULT) -> int:
    """Rings live in the store beside the snapshot: by default all of them together may take
    at most half of what the store has free when the daemon starts."""
    return free_nbytes(store) // 2


def ring_budget(config: DaemonConfig, store: Store) -> tuple[int, str]:
    """(bytes all rings together may take, where that figure came from: the flag, or half of
    the store's free space at start), the second for a refusal to say."""
    if config.max_total_ring_nbytes:
        return config.max_total_ring_nbytes, "set by --max-total-ring-nbytes"
    free = free_nbytes(store)
    return free // 2, f"half of the {free} bytes {store} had free when the daemon started"
