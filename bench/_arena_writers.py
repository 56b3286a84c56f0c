"""``bench/prepare.py --writers``: two processes writing records into a store, four ways.

Runs in the shell process, which forks the writers (plain os.fork: they only write bytes
with os and numpy, and exit with ``os._exit``). Each writer writes every other record of
``records`` records of ``record_nbytes`` (0.9 MB: a 640x480 uint8 image; 3.7 MB: float32):
``pwrite`` into one shared file (what the arena is), ``pwrite`` into a file per writer (what
per-decoder arena files would be), a store through a shared mapping as it faults, and the
same after ``MADV_POPULATE_WRITE`` of each record (what ``ArenaWriter`` does on a huge-page
store). Reports per record: wall time and the writers' CPU (user + system, of which system).
On tmpfs every ``pwrite`` takes the file's inode lock, so the shared-file arm shows what two
decoders pay for writing one arena file.
"""

from __future__ import annotations

import mmap
import os
import resource
import statistics
import time

ARMS = (("pwrite", False), ("pwrite", True), ("mapping", False), ("mapping + populate", False))


def _writer(k: int, writers: int, how: str, path: str, records: int, src, per_writer_file: bool) -> None:
    import numpy as np

    from pixpool.server.snapshot.arena_pages import MADV_POPULATE_WRITE

    n = src.nbytes
    fd = os.open(path, os.O_RDWR)
    if how != "pwrite":
        mm = mmap.mmap(fd, os.fstat(fd).st_size)
        arena = np.frombuffer(mm, dtype=np.uint8)
    for j in range(k, records, writers):
        off = (j // writers if per_writer_file else j) * n
        if how == "pwrite":
            os.pwrite(fd, src, off)
            continue
        if how == "mapping + populate":
            start = off - off % mmap.PAGESIZE
            mm.madvise(MADV_POPULATE_WRITE, start, off + n - start)
        arena[off : off + n] = src
    os._exit(0)


def _run(store: str, how: str, per_writer_file: bool, records: int, writers: int, src) -> tuple[float, float, float]:
    n = src.nbytes
    paths = [
        os.path.join(store, f"bench-arena-writers-{os.getpid()}-{k if per_writer_file else 0}") for k in range(writers)
    ]
    for path in set(paths):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.ftruncate(fd, n * (-(-records // writers) if per_writer_file else records))
        os.close(fd)
    try:
        r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        pids = []
        for k in range(writers):
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child
                try:
                    _writer(k, writers, how, paths[k], records, src, per_writer_file)
                finally:
                    os._exit(1)
            pids.append(pid)
        for pid in pids:
            os.waitpid(pid, 0)
        wall = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    finally:
        for path in set(paths):
            os.unlink(path)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return wall, cpu, r1.ru_stime - r0.ru_stime


def print_writers(store: str, rounds: int, records: int = 512, writers: int = 2) -> None:
    import numpy as np

    load_before = os.getloadavg()
    rows = []
    for record_nbytes, what in ((640 * 480 * 3, "uint8"), (640 * 480 * 3 * 4, "float32")):
        src = np.random.default_rng(0).integers(0, 255, record_nbytes, dtype=np.uint8)
        runs: dict[tuple, list] = {arm: [] for arm in ARMS}
        for r in range(rounds):
            for arm in ARMS if r % 2 == 0 else ARMS[::-1]:
                runs[arm].append(_run(store, arm[0], arm[1], records, writers, src))
        for (how, own), v in runs.items():
            med = [1e3 * statistics.median(x[i] for x in v) / records for i in range(3)]
            rows.append((what, f"{how}, {'a file per writer' if own else 'one shared file'}", *med))
    load_after = os.getloadavg()
    print(
        f"{writers} writers, {records} records each run, store {store}, medians of {rounds} alternating rounds; load "
        f"before {'/'.join(f'{x:.2f}' for x in load_before)}, after {'/'.join(f'{x:.2f}' for x in load_after)}"
    )
    print(f"  {'record':8s} {'how':40s} {'wall ms':>8s} {'cpu ms':>8s} {'sys ms':>8s}   (per record)")
    for what, how, wall, cpu, sys_ms in rows:
        print(f"  {what:8s} {how:40s} {wall:8.3f} {cpu:8.3f} {sys_ms:8.3f}")
