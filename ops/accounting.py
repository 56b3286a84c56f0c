"""Memory accountant: what a snapshot retains, measured, against a decoded uint8 cache.

Runs in the producer's commands (``pixpool prepare``) and wherever a snapshot's cost is
reported. Nothing is estimated where it can be measured: snapshot bytes come from the
segment files' sizes in the snapshot's store (and, for a store on disk, how much of them
is in the page cache now: ``shared.transport.store.resident_nbytes``); the decoded-uint8
equivalent is the sum of h * w * 3 over the snapshot's index (``Snapshot.decoded_nbytes``).
What processes hold is measured by ``pixpool.shared.transport.procmem``.
"""

from __future__ import annotations

import os

from ..shared.text import format_table, human_bytes
from ..shared.transport import store as _store
from ..shared.transport.names import parse
from ..shared.transport.procmem import ProcessMemory
from ..shared.transport.store import Store


# -- snapshot bytes ----------------------------------------------------------------------
def snapshot_bytes(snapshot) -> dict:
    """Bytes per segment of ``snapshot`` (measured from the files) and the uint8 equivalent.

    Keys: ``segments`` (segment name -> bytes), ``image_bytes``, ``meta_bytes`` (header +
    index), ``target_bytes``, ``total_bytes``, ``decoded_bytes`` (same resized images as
    uint8), ``ratio`` (image_bytes / decoded_bytes: 4 for a float32 snapshot, 1 for uint8),
    ``dtype`` (the arena's pixel type), ``store`` (its path), ``memory``
    (the store is RAM) and ``resident_bytes`` (of ``total_bytes``, what is in memory now:
    every allocated page in a memory store; the page-cached pages on disk). ``polygon_bytes``
    and ``keypoint_bytes`` say how much of ``target_bytes`` (measured) the polygons and the
    keypoints take (from the snapshot's section layout), and ``task`` what it was prepared for.
    """
    store = Store.of(getattr(snapshot, "store", None))
    memory = _store.is_memory(store)
    sizes, resident = {}, 0
    for name in snapshot.segment_names:
        path = store.path(name)
        st = os.stat(path)
        sizes[name] = st.st_size
        resident += st.st_blocks * 512 if memory else _store.resident_nbytes(path)
    part = {parse(name).part: size for name, size in sizes.items()}
    decoded = snapshot.decoded_nbytes
    return {
        "segments": sizes,
        "image_bytes": part["img"],
        "meta_bytes": part["meta"],
        "target_bytes": part["tgt"],
        "polygon_bytes": int(getattr(snapshot, "polygon_nbytes", 0)),
        "keypoint_bytes": int(getattr(snapshot, "keypoint_nbytes", 0)),
        "task": snapshot.spec.name,
        "total_bytes": sum(sizes.values()),
        "decoded_bytes": decoded,
        "ratio": part["img"] / decoded if decoded else float("nan"),
        "dtype": snapshot.dtype,
        "store": str(store),
        "memory": memory,
        "resident_bytes": resident,
    }


def format_snapshot_report(snap_bytes: dict, *, records: int | None = None) -> str:
    rows = [[name, n, human_bytes(n)] for name, n in snap_bytes["segments"].items()]
    # The targets segment's share of polygons and keypoints (pose, segment and obb sets hold them
    # once here, for every trainer): part of the segment's figure above, not added to the total.
    for key, label in (
        ("polygon_bytes", "  of the targets: polygons"),
        ("keypoint_bytes", "  of the targets: keypoints"),
    ):
        if snap_bytes.get(key):
            rows.append([label, snap_bytes[key], human_bytes(snap_bytes[key])])
    rows.append(["total retained", snap_bytes["total_bytes"], human_bytes(snap_bytes["total_bytes"])])
    if not snap_bytes.get("memory", True):
        rows.append(["in the page cache now", snap_bytes["resident_bytes"], human_bytes(snap_bytes["resident_bytes"])])
    rows.append(["decoded uint8 equivalent", snap_bytes["decoded_bytes"], human_bytes(snap_bytes["decoded_bytes"])])
    text = format_table(rows, ["segment", "bytes", "size"])
    extra = f"{snap_bytes.get('dtype', '?')} images / uint8 equivalent = {snap_bytes['ratio']:.3f}"
    if records is not None:
        extra = f"{records} records; " + extra
    return text + "\n" + extra


def format_process_report(procs: list[ProcessMemory]) -> str:
    rows = []
    for p in procs:
        seg_rss = sum(s["rss"] for s in p.segments.values())
        rows.append([p.pid, p.name, human_bytes(p.rss), human_bytes(p.uss), human_bytes(p.pss), human_bytes(seg_rss)])
    return format_table(rows, ["pid", "name", "rss", "uss", "pss", "pixpool resident"])
