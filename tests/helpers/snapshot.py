"""Helpers shared by the snapshot/prepare tests: hand-built datasets and leftover checks."""

from __future__ import annotations

import os
from pathlib import Path

import cv2
import numpy as np

from pixpool.server.snapshot.handle import read_header
from pixpool.shared.errors import SnapshotError
from pixpool.shared.stream.records import Dataset, Record
from pixpool.shared.transport.names import kind_of, ring_prefix
from pixpool.shared.transport.names import snapshot_parts as parts_of_base
from pixpool.shared.transport.shm import unlink_segment
from pixpool.shared.transport.store import Store


def write_jpegs(folder: Path, sizes_hw, *, seed: int = 0) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for i, (h, w) in enumerate(sizes_hw):
        img = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
        path = folder / f"img_{i:03d}.jpg"
        cv2.imwrite(str(path), img)
        paths.append(str(path))
    return paths


def dataset_of(paths, source_files=()) -> Dataset:
    """One box + triangle per image (the second image has none: a background record)."""
    records = []
    for i, p in enumerate(paths):
        if i == 1:
            records.append(Record(p, None, np.zeros(0, np.int32), np.zeros((0, 4), np.float32)))
            continue
        records.append(Record(p, None, np.array([i % 3], np.int32), np.array([[0.1, 0.2, 0.6, 0.7]], np.float32),
                              (np.array([[0.1, 0.2], [0.6, 0.2], [0.6, 0.7]], np.float32),)))  # fmt: skip
    return Dataset(tuple(records), ("a", "b", "c"), tuple(str(s) for s in source_files))


def created_by_me(before: set[str], store: str | None = None) -> list[str]:
    """New pixpool segments since ``before`` that this process made (others may run in parallel).

    A snapshot segment counts as ours when its snapshot's header names this pid as creator,
    or when no readable header exists for it (a half-made snapshot); any other new pixpool
    segment counts too unless it is a ring of another pid.
    """
    store, mine = Store.of(store), []
    for seg in sorted(set(store.segments()) - before):
        kind = kind_of(seg)
        if kind == "snapshot":
            try:
                header = read_header(parts_of_base(seg.rpartition("-")[0])["meta"], store)
                if header.creator_pid != os.getpid():
                    continue
            except SnapshotError:
                pass
        elif kind == "ring" and not seg.startswith(ring_prefix(os.getpid())):
            continue
        mine.append(seg)
    return mine


def remove_snapshot(base: str, store: str | None = None) -> None:
    """Every file of snapshot ``base``: its segments and any label index beside them."""
    from pixpool.server.snapshot.handle import unit_names

    store = Store.of(store)
    for seg in unit_names(base, store):
        unlink_segment(seg, store)
