"""Admission: what a trainer's ``attach`` gets, or why it is refused.

Runs in the daemon process, in its loop (``service.py``).

- ``check_quota``: how many sessions one client (a uid, or a CURVE key) may hold.
- ``ring_for`` decides an ``attach``: the trainer's settings (at the snapshot's imgsz) and the
  ring's bytes against the budgets
  (per ring, all rings, and the memory budget of snapshot plus rings). A refusal is an
  ``error`` reply to that trainer only; the others are served on.
- ``default_ring_budget``: what all rings together may take when no budget is set.

Where the daemon listens is ``listener.py``; the checks before it starts ``preflight.py``;
the sweep of dead daemons' rings ``sweeps.py``; the store's free space ``store_watch.py``.
"""

from __future__ import annotations

from ...shared.errors import CapacityError, ConfigError
from ...shared.stream import protocol as proto
from ...shared.stream.config import DaemonConfig, StreamSettings
from ...shared.transport.ring import MAX_SLOTS, MIN_SLOTS, RingLayout
from ...shared.transport.store import DEFAULT_STORE, free_nbytes

__all__ = ["check_quota", "default_ring_budget", "ring_for"]


def check_quota(config: DaemonConfig, client: str, held: int) -> None:
    """CapacityError when ``client`` already holds its share of sessions (``held``)."""
    if client and held >= config.max_trainers_per_client:
        who = f"CURVE key {client[4:]}" if client.startswith("key:") else f"uid {client[4:]}"
        raise CapacityError(
            f"{who} already has {held} trainers attached, the daemon's limit per client "
            f"(max_trainers_per_client = {config.max_trainers_per_client}); detach one of them "
            "or raise max_trainers_per_client (--max-trainers-per-client)"
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
) -> RingLayout:
    """The ring an ``attach`` gets, or ConfigError/CapacityError saying what to change.

    ``settings`` are already at the snapshot's imgsz (``StreamSettings.for_imgsz``, which
    refused a trainer asking for another): the ring is sized by ``source.imgsz``."""
    slots = msg["slots"]
    if not MIN_SLOTS <= slots <= MAX_SLOTS:
        raise ConfigError(
            f"slots {slots} is out of range; use {MIN_SLOTS} to {MAX_SLOTS} (all workers render into one slot together, so {MAX_SLOTS} keep a trainer fed whatever the worker count)",
            field="slots",
        )
    if msg["delivery"] not in proto.DELIVERIES:
        raise ConfigError(
            f"delivery {msg['delivery']!r}: use {proto.DELIVERY_SHM!r} (same machine) or {proto.DELIVERY_FRAMES!r} (TCP)"
        )
    max_t = max(1, renderer.max_targets(source.max_instances, settings))
    layout = RingLayout(slots=slots, batch_size=settings.batch_size, imgsz=source.imgsz, max_targets=max_t)
    if layout.nbytes > config.max_ring_nbytes:
        raise CapacityError(
            f"a ring of {slots} slots for batch {settings.batch_size} at imgsz {source.imgsz} needs {layout.nbytes} bytes "
            f"({max_t} target rows per slot: the snapshot's densest image has {source.max_instances} instances), "
            f"over the daemon's limit of {config.max_ring_nbytes}; use fewer slots or a smaller batch, fix that image's labels, or raise max_ring_nbytes"
        )
    if rings_nbytes + layout.nbytes > ring_budget_nbytes:
        raise CapacityError(
            f"a ring of {layout.nbytes} bytes on top of the {rings_nbytes} bytes of attached trainers' rings exceeds the daemon's "
            f"budget of {ring_budget_nbytes} bytes; use fewer slots or a smaller batch, or raise max_total_ring_nbytes"
        )
    budget = config.memory_budget_nbytes
    if budget is not None and snapshot_nbytes + rings_nbytes + layout.nbytes > budget:
        raise CapacityError(
            f"a ring of {layout.nbytes} bytes on top of the snapshot's {snapshot_nbytes} and the attached trainers' {rings_nbytes} bytes "
            f"exceeds the daemon's memory budget of {budget} bytes (in use {snapshot_nbytes + rings_nbytes}); "
            "use fewer slots or a smaller batch, detach a trainer, or raise the budget (--memory-budget)"
        )
    if trainers >= config.max_trainers:
        raise CapacityError(f"{trainers} trainers are attached, the daemon's limit; detach one or raise max_trainers")
    return layout


def default_ring_budget(store: str = DEFAULT_STORE) -> int:
    """Rings live in the store beside the snapshot: by default all of them together may take
    at most half of what the store has free when the daemon starts."""
    return free_nbytes(store) // 2
