"""bench/label_trust.py: what the label index's checks cost at scale (issue 26, fault 4).

Runs in one process (the measurer); daemons run as ``pixpool serve`` subprocesses.

``restart``: restart-to-ready of ``pixpool serve`` on a kept N-record set (``bench/scale.py
--keep DIR`` builds and prepares it), alternating two code trees in pairs (``--code
before=PATH --code after=PATH``: each a folder holding a ``pixpool`` package, put first on
``PYTHONPATH``; the order flips every pair). Each tree gets its own copy of the kept store
(their indexes differ in format), and one warm-up start that writes its index; every timed
start must say it re-attached on its label index, or the run stops.

``check``: the index check alone, in this process, on the index in a store (``--store``):
``read_index`` + ``first_change`` as written, and again with every label checked by its bytes
(what a set on tmpfs, or with labels changed in the last minutes, pays).

``mmap``: whether a write through a shared mapping moves a file's mtime/ctime, on each folder
given (the reason labels on tmpfs are hashed; ``server/snapshot/fs_trust.py``).

Usage::

    python bench/label_trust.py restart --keep /tmp/k100 --code before=/tmp/before --code after=/tmp/after --pairs 5
    python bench/label_trust.py check --store /dev/shm/pxscale-keep-k100 --rounds 3
    python bench/label_trust.py mmap /dev/shm /tmp
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _copy_store(src: str, dst: str) -> None:
    """The kept store's snapshot segments (never its label indexes) into a fresh folder ``dst``."""
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(dst, mode=0o700)
    for name in os.listdir(src):
        if "-lix" not in name:
            shutil.copy(os.path.join(src, name), os.path.join(dst, name))


def _timed_start(scale, data: Path, store: str, code: str, work: Path, label: str):
    """(seconds to ready, seconds its label index check took by its log or None) of one restart;
    None for the check where the log does not say it re-attached on its index."""
    log_path = work / f"serve-{label}.log"
    before = log_path.stat().st_size if log_path.exists() else 0
    os.environ["PYTHONPATH"] = code  # inherited by the daemon subprocess only: this process imported its pixpool
    try:
        proc, secs = scale.start_daemon(data, store, 64, 2, str(work / f"sock-{label}"), log_path)
    finally:
        os.environ.pop("PYTHONPATH", None)
    scale.stop_daemon(proc)
    with open(log_path, "rb") as f:
        f.seek(before)
        text = f.read().decode(errors="replace")
    found = re.search(r"paths unchanged \(([0-9.]+) s\)", text)
    if "re-attached on its label index" not in text or found is None:
        return secs, None
    return secs, float(found.group(1))


def restart(args) -> dict:
    import scale

    work = Path(args.keep)
    data = work / "set" / "data.yaml"
    base = f"/dev/shm/pxscale-keep-{work.name}"
    codes = dict(c.split("=", 1) for c in args.code)
    stores = {label: f"{base}-{label}" for label in codes}
    for label in codes:
        if not (args.reuse_stores and os.path.isdir(stores[label])):
            _copy_store(base, stores[label])
    out: dict = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_before": os.getloadavg()}
    try:
        for label, code in codes.items():  # warm-up: writes this code's index (a full read)
            out[f"warmup_{label}_s"], _ = _timed_start(scale, data, stores[label], code, work, label)
        runs: dict = {label: [] for label in codes}
        checks: dict = {label: [] for label in codes}
        loads = []
        order = list(codes)
        for pair in range(args.pairs):
            for label in order if pair % 2 == 0 else order[::-1]:
                secs, check_s = _timed_start(scale, data, stores[label], codes[label], work, label)
                if check_s is None:
                    raise SystemExit(f"{label}: restart {pair} did not re-attach on its label index; see its log")
                runs[label].append(secs)
                checks[label].append(check_s)
            loads.append(os.getloadavg()[0])
        out["runs"] = runs
        out["medians"] = {label: statistics.median(v) for label, v in runs.items()}
        out["pair_diffs"] = [b - a for a, b in zip(*runs.values())]
        out["index_check_s"] = checks  # find_trusted's own time, from each daemon's log
        out["index_check_medians"] = {label: statistics.median(v) for label, v in checks.items()}
        out["load_1min_per_pair"] = loads
    finally:
        for store in stores.values():
            if not args.keep_stores:
                shutil.rmtree(store, ignore_errors=True)
    out["stores"] = stores
    out["load_after"] = os.getloadavg()
    return out


def check(args) -> dict:
    import dataclasses

    import numpy as np

    from pixpool.server.snapshot import fs_trust, label_index
    from pixpool.shared.transport.names import list_segments

    (name,) = [s for s in list_segments(args.store) if "-lix" in s]
    out: dict = {"index": name, "read_s": [], "check_s": [], "content_check_s": [], "load": os.getloadavg()}
    index = label_index.read_index(name, args.store)
    # Every label by its bytes: the same index with its label rows turned to CONTENT.
    paths = index.check_paths.tolist()
    modes = index.check_modes.copy()
    labels = [i for i, p in enumerate(paths) if p.endswith(".txt") and index.check_stats[i, 0] >= 0]
    modes[labels] = label_index.CONTENT
    hashed = np.flatnonzero(modes != label_index.STAT)
    old = {int(i): k for k, i in enumerate(np.flatnonzero(index.check_modes != label_index.STAT))}
    digests = np.zeros((len(hashed), 32), np.uint8)
    for k, i in enumerate(hashed.tolist()):
        if i in old:
            digests[k] = index.check_digests[old[i]]
        else:
            digests[k] = np.frombuffer(fs_trust.file_digest(paths[i])[0], np.uint8)
    hashed_index = dataclasses.replace(index, check_modes=modes, check_digests=digests)
    for _ in range(args.rounds):  # the two arms alternate, so that the machine's load falls on both
        t0 = time.perf_counter()
        index = label_index.read_index(name, args.store)
        out["read_s"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        assert label_index.first_change(index) is None
        out["check_s"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        assert label_index.first_change(hashed_index) is None
        out["content_check_s"].append(time.perf_counter() - t0)
    out["medians"] = {k: statistics.median(out[k]) for k in ("read_s", "check_s", "content_check_s")}
    out["paths"], out["labels"] = len(paths), len(labels)
    out["modes"] = {m: int((index.check_modes == v).sum()) for m, v in (("stat", 0), ("content", 1), ("listing", 2))}
    out["load_after"] = os.getloadavg()
    return out


def mmap_times(args) -> dict:
    """For each folder: does the first mapped write, and a write after msync, move the times?"""
    out = {}
    for folder in args.folders:
        fd_path = tempfile.mktemp(prefix="pxf4-mmap-", dir=folder)
        try:
            with open(fd_path, "wb") as f:
                f.write(b"0 0.5 0.5 0.1 0.1\n")
                f.flush()
                os.fsync(f.fileno())
            fd = os.open(fd_path, os.O_RDWR)
            try:
                m = mmap.mmap(fd, 0)
                s0 = os.stat(fd_path)
                time.sleep(0.05)  # a clock tick between the stats (coarse file-system clocks)
                m[0:1] = b"1"
                s1 = os.stat(fd_path)
                m.flush()  # msync: written back where the file system has writeback
                time.sleep(0.05)
                m[0:1] = b"2"
                s2 = os.stat(fd_path)
                m.close()
            finally:
                os.close(fd)

            def times(s):
                return (s.st_mtime_ns, s.st_ctime_ns)

            out[folder] = {"first_write_moves": times(s0) != times(s1), "after_msync_moves": times(s1) != times(s2)}
        finally:
            os.unlink(fd_path)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("restart")
    r.add_argument("--keep", required=True, help="the folder bench/scale.py --keep built")
    r.add_argument("--code", action="append", required=True, help="LABEL=PATH (twice)")
    r.add_argument("--pairs", type=int, default=5)
    r.add_argument("--keep-stores", action="store_true", help="keep each tree's store (for `check`); remove by hand")
    r.add_argument("--reuse-stores", action="store_true", help="use each tree's store a --keep-stores run left")
    c = sub.add_parser("check")
    c.add_argument("--store", required=True)
    c.add_argument("--rounds", type=int, default=3)
    m = sub.add_parser("mmap")
    m.add_argument("folders", nargs="+")
    args = parser.parse_args(argv)
    result = {"restart": restart, "check": check, "mmap": mmap_times}[args.cmd](args)
    print(json.dumps(result, indent=2, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
