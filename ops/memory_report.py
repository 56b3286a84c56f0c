"""``memory_report``: what the service and its trainers retain, measured, against uint8 caches.

Runs in an operator's process (``pixpool memory``, ``monitor``, ``demo``, the memory
benchmark). Inputs: the daemon's ``status`` reply (who is who: daemon, workers, trainers,
which segments are the snapshot and the rings, and the store they are in), the segment
files in that store (sizes and resident pages), and the kernel's accounting of each local process (``smaps_rollup`` for
RSS/USS/PSS, ``smaps`` for each process's share of each segment). Nothing is estimated
where it can be measured. The fields are documented in ``docs/memory.md``.

How a segment is counted, so that nothing is counted twice or not at all: PSS divides a
shared page among the processes that map it, and a tmpfs page nobody maps is in no PSS.
The service (daemon + workers) is charged its own PSS plus every page of its segments
(snapshot, rings) that it does not hold itself (the trainers' shares of the rings and pages
no process maps), so each segment counts once, whole, in ``service_pss_bytes``; a trainer
is charged its PSS less its share of the service's segments.

Resident against file bytes: in a store in memory (/dev/shm, a tmpfs) every allocated
page of a segment file is memory (``resident_bytes`` = its allocated blocks). In a store on
disk a segment's ``bytes`` are file bytes, and only the pages in the page cache are memory:
``resident_bytes`` is then counted page by page with ``mincore`` (``shared.transport.store``); the
kernel may drop clean ones (and read them again on use), so on a disk store the figures
are what is in memory now, not what the service would need to hold.

Break-even: with pixpool, N trainers cost F + N x r (F the service's measured cost without
rings, r the mean measured ring); with a decoded uint8 cache each, N x d (d the decoded
bytes of the resized images). ``break_even_trainers`` is the smallest N with N x d >= F + N x r
(None while no trainer is attached, or when a ring costs more than a uint8 cache).

Validation streams (sessions on the ``val`` split: ``pixpool train`` attaches one for each
validation pass and detaches it after) are no trainers: they are not counted in
``trainers``, their rings are ``validation_ring_bytes`` (part of ``ring_bytes``, the bytes of
every ring now), and r is the mean training ring (``ring_bytes_per_trainer``). F leaves out
every ring, so a validation pass under way does not move the break-even.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ..shared.break_even import break_even
from ..shared.transport import store as _store
from ..shared.transport.names import parse
from ..shared.transport.procmem import process_memory
from ..shared.transport.store import Store
from ..shared.wire.status import Status, TrainerStatus
from ..shared.wire.trainer import DELIVERY_SHM

__all__ = [
    "break_even",
    "is_validation",
    "memory_report",
    "segment_figures",
    "snapshot_segments",
    "stream_labels",
    "trainer_ids",
]


def segment_figures(store: Store) -> dict[str, dict[str, int]]:
    """Every pixpool segment file in ``store``: name -> {bytes (file size), allocated_bytes
    (its blocks), resident_bytes (in memory; module docstring)}."""
    memory = _store.is_memory(store)
    out = {}
    for name in store.segments():
        path = store.path(name)
        try:
            st = os.stat(path)
            resident = st.st_blocks * 512 if memory else _store.resident_nbytes(path)
        except (FileNotFoundError, PermissionError):
            continue
        out[name] = {"bytes": st.st_size, "allocated_bytes": st.st_blocks * 512, "resident_bytes": resident}
    return out


def _roles(status: Status) -> dict[int, tuple[str, int | None]]:
    roles: dict[int, tuple[str, int | None]] = {status.daemon.pid: ("daemon", None)}
    roles.update({w.pid: ("worker", w.index) for w in status.workers if w.pid})
    # Trainers whose pid is this machine's and this PID namespace's (the daemon watches it);
    # remote ones, and local ones in another PID namespace, are not measurable by pid here.
    measurable = [t for t in status.trainers if t.pid and t.watched]
    roles.update({pid: ("trainer", trainer_id) for pid, trainer_id in trainer_ids(measurable).items()})
    return roles


def is_validation(trainer: TrainerStatus) -> bool:
    """A session that streams the val split: a trainer's validation pass, not a trainer."""
    return trainer.is_validation


def trainer_ids(trainers: Sequence[TrainerStatus]) -> dict[int, int]:
    """pid -> the number every view gives that trainer process: the daemon's id of its training
    stream (its validation stream, a second session of the same process, is part of it)."""
    ids: dict[int, int] = {}
    for t in sorted(trainers, key=lambda t: not t.is_validation):  # training streams last: they win
        ids[t.pid] = t.trainer_id
    return ids


def stream_labels(trainers: Sequence[TrainerStatus]) -> list[tuple[str, str]]:
    """(who, epoch:batch) of each session as every view shows it: a validation stream is its
    trainer's ("3 val", "val:b/n"; the daemon's epoch of a pass is -1), never a trainer of its own."""
    owner = trainer_ids(trainers)
    out = []
    for t in trainers:
        if t.is_validation:
            mine = t.of_trainer or (owner.get(t.pid) if t.pid else None)  # a daemon before of_trainer
            who = f"{mine} val" if mine else "val"
            out.append((who, f"val:{t.next_batch}/{t.num_batches}"))
        else:
            out.append((str(t.trainer_id), f"{t.epoch}:{t.next_batch}/{t.num_batches}"))
    return out


def snapshot_segments(status: Status) -> list[str]:
    """The segments of every snapshot the daemon serves (training and validation), each once."""
    return sorted({name for info in status.served.values() for name in info.segments or ()})


def _served_sum(status: Status, key: str) -> int:
    """``key`` summed over every snapshot the daemon serves, each once (0 where a daemon does not say)."""
    by_name = {info.name if info.name is not None else split: info for split, info in status.served.items()}
    return sum(int(getattr(info, key) or 0) for info in by_name.values())


def memory_report(status: Status, *, store: str | Store | None = None) -> dict:
    """The measured figures (see module docstring and ``docs/memory.md``). ``store``: where
    this process sees the daemon's store (default the path the daemon reports)."""
    snap = status.snapshot
    store = Store.of(store or status.daemon.store)
    segs = segment_figures(store)
    served = snapshot_segments(status)
    snapshot_segs = [s for s in served if s in segs]
    ring_of = {t.ring: t for t in status.trainers}
    ring_segs = [r for r in ring_of if r in segs]
    service_segs = set(snapshot_segs) | set(ring_segs)
    part: dict[str, int] = {}
    for name in snapshot_segs:
        part[parse(name).part] = part.get(parse(name).part, 0) + segs[name]["bytes"]

    roles = _roles(status)
    procs = []
    held_by_service = dict.fromkeys(service_segs, 0)
    service_own = trainers_own = 0
    for p in process_memory(list(roles), store):
        role, index = roles[p.pid]
        in_service_segs = sum(v["pss"] for name, v in p.segments.items() if name in service_segs)
        procs.append(
            {
                "pid": p.pid,
                "role": role,
                "index": index,
                "name": p.name,
                "rss_bytes": p.rss,
                "uss_bytes": p.uss,
                "pss_bytes": p.pss,
                "segments_pss_bytes": in_service_segs,
            }
        )
        if role == "trainer":
            trainers_own += p.pss - in_service_segs
        else:
            service_own += p.pss
            for name, v in p.segments.items():
                if name in held_by_service:
                    held_by_service[name] += v["pss"]
    # Pages of the service's segments it does not hold itself: trainers' shares, pages no one maps.
    not_held = sum(max(0, segs[s]["resident_bytes"] - held_by_service[s]) for s in service_segs)
    service = service_own + not_held
    rings = [
        {
            "trainer_id": t.trainer_id,
            "pid": t.pid,
            "host": t.host,
            "local": t.delivery == DELIVERY_SHM,
            "ring": name,
            "slots": t.slots,
            "bytes": segs[name]["bytes"] if name in segs else 0,
            "mask_bytes": t.ring_mask_nbytes,  # segment rings' mask planes, part of ``bytes``
            "validation": t.is_validation,
        }
        for name, t in ring_of.items()
    ]
    ring_bytes = sum(segs[r]["resident_bytes"] for r in ring_segs)
    validation_ring_bytes = sum(segs[r]["resident_bytes"] for r in ring_segs if ring_of[r].is_validation)
    training_ring_bytes = ring_bytes - validation_ring_bytes
    decoded = int(snap.decoded_bytes or 0)
    # Training streams only (module docstring): a validation stream is part of its trainer.
    n = sum(1 for t in status.trainers if not t.is_validation)
    per_trainer = training_ring_bytes // n if n else None
    where = _store.describe(store)
    return {
        "snapshot": snap.name or "",
        "snapshots": sorted({info.name or "" for info in status.served.values()}),
        "dtype": snap.dtype or "?",  # every reply names it; never guessed
        "records": snap.records,
        "image_bytes": part.get("img", 0),
        "index_bytes": part.get("meta", 0),
        "target_bytes": part.get("tgt", 0),
        # Of target_bytes: what the polygons and the keypoints take (the daemon's section layout).
        "polygon_bytes": _served_sum(status, "polygon_bytes"),
        "keypoint_bytes": _served_sum(status, "keypoint_bytes"),
        "snapshot_bytes": sum(segs[s]["bytes"] for s in snapshot_segs),
        "snapshot_resident_bytes": sum(segs[s]["resident_bytes"] for s in snapshot_segs),
        "decoded_bytes": decoded,
        "rings": rings,
        "ring_bytes": ring_bytes,
        "validation_ring_bytes": validation_ring_bytes,
        "ring_bytes_per_trainer": per_trainer,
        "processes": procs,
        "service_pss_bytes": service,
        "trainers_pss_bytes": trainers_own,
        "total_pss_bytes": service + trainers_own,
        "trainers": n,
        "uint8_caches_bytes": n * decoded,
        "break_even_trainers": break_even(service - ring_bytes, per_trainer, decoded),
        "store": where,
        "segments": segs,
    }
