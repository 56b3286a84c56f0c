"""bench/locks.py: what the in-use lock (``shared/transport/holds.py``) costs per attach.

Runs in one process. A snapshot of the synthetic dataset is prepared in the store and kept
for the run; every round attaches and closes its three segments ``--attaches`` times in
each of two arms, alternating (the order swaps each round), and reports the medians over
rounds of the time per snapshot attach+close (three segments):
- ``locked``: ``SharedSegment.attach`` + ``close`` as pixpool does it: open, trust check,
  OFD read lock, name-still-this-file check, mmap; the descriptor kept until close;
- ``unlocked``: the same ``SharedSegment.attach`` + ``close`` with the hold step (the lock
  and the name check, ``shm._held_or_gone``) replaced by nothing: the difference is the
  lock's cost alone.
It also times the probes that decide: ``holds_of`` (``ls``/``clean``: one open and three
lock tests) and a refused ``remove_unused`` (a write lock attempt) per segment.

Usage: ``python bench/locks.py [--rounds 15] [--attaches 300] [--store /dev/shm]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time


def _attach(name: str, store: str) -> None:
    from pixpool.shared.transport.shm import SharedSegment

    SharedSegment.attach(name, store=store).close()


def _no_hold(fd, name, path, roles, st=None) -> None:
    pass


def _per_call_us(fn, names: list[str], store: str, n: int, *, hold=None) -> float:
    from pixpool.shared.transport import shm

    real = shm._held_or_gone
    if hold is not None:
        shm._held_or_gone = hold
    try:
        t0 = time.perf_counter()
        for _ in range(n):
            for name in names:
                fn(name, store)
        return (time.perf_counter() - t0) / n * 1e6
    finally:
        shm._held_or_gone = real


def main(argv=None) -> int:
    from pixpool.shared.transport.names import DEFAULT_STORE

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--attaches", type=int, default=300, help="snapshot attaches per arm and round")
    parser.add_argument("--store", default=DEFAULT_STORE)
    args = parser.parse_args(argv)

    from pixpool.server.readers import load_dataset
    from pixpool.server.snapshot.prepare import PrepareOptions, prepare_snapshot
    from pixpool.server.synthetic import write_synthetic
    from pixpool.shared.transport import holds

    with tempfile.TemporaryDirectory() as tmp:
        data = write_synthetic(tmp, num_images=24, seed=0)
        dataset = load_dataset(data.coco_json)
        snap = prepare_snapshot(
            dataset, PrepareOptions(imgsz=96, processes=1, keep_snapshot=True, store=args.store)
        ).snapshot
    names = list(snap.segment_names)
    try:
        arms = {"locked": None, "unlocked": _no_hold}
        for hold in arms.values():  # warm both paths
            _per_call_us(_attach, names, args.store, 20, hold=hold)
        times: dict[str, list[float]] = {k: [] for k in arms}
        order = list(arms)
        for _ in range(args.rounds):
            for arm in order:
                times[arm].append(_per_call_us(_attach, names, args.store, args.attaches, hold=arms[arm]))
            order.reverse()
        probe_us = _per_call_us(lambda n, s: holds.holds_of(n, s), names, args.store, args.attaches) / len(names)
        refused_us = _per_call_us(lambda n, s: holds.remove_unused([n], s), names, args.store, args.attaches)
        refused_us /= len(names)
        med = {arm: statistics.median(v) for arm, v in times.items()}
        out = {
            "segments_per_attach": len(names),
            "snapshot_bytes": sum(snap.nbytes.values()),
            "median_us_per_snapshot_attach_close": {k: round(v, 1) for k, v in med.items()},
            "lock_cost_us_per_snapshot_attach": round(med["locked"] - med["unlocked"], 1),
            "lock_cost_us_per_segment": round((med["locked"] - med["unlocked"]) / len(names), 2),
            "spread_us": {k: [round(min(v), 1), round(max(v), 1)] for k, v in times.items()},
            "holds_of_us_per_segment": round(probe_us, 2),
            "refused_remove_us_per_segment": round(refused_us, 2),
            "rounds": args.rounds, "attaches_per_round": args.attaches,
        }  # fmt: skip
        # Every probe above was refused (the bench's own handle holds the snapshot).
        print(json.dumps(out, indent=1))
    finally:
        snap.close()
        holds.remove_unused(names, args.store)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
