"""What a preparation itself holds in its store: for the errors that say the store is too small.

Runs in the preparing process and in its decode workers, only once a store turned out too
small (a capacity check, or ``ENOSPC`` at a write). Besides the snapshot's segments, a
preparation with decode workers holds files in /dev/shm of its own: every multiprocessing
lock and queue of its worker pool is a POSIX named semaphore, a ``/dev/shm/sem.*`` file that
takes a whole page of tmpfs, and its shared counters sit in a multiprocessing heap file there
(``pym-*``, unlinked at once). Where the store is /dev/shm's file system these count against
the snapshot's room, so a message about a full store counts them rather than blaming
"something else". Which files are this process's is read from ``/proc/self/maps`` (every such
file is mapped by each process that uses it); the parsing is a pure function.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...shared.transport.store import Store

SHM = "/dev/shm"


def parse_shm_maps(text: str) -> dict[int, str]:
    """inode -> path, for every file under /dev/shm in the text of a ``/proc/<pid>/maps`` that is
    a POSIX semaphore (``sem.*``) or a multiprocessing heap file (``pym-*``)."""
    out = {}
    for line in text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6:
            continue
        path = fields[5].removesuffix(" (deleted)")
        name = path.rpartition("/")[2]
        if path.startswith(SHM + "/") and (name.startswith("sem.") or name.startswith("pym-")):
            out[int(fields[4])] = path
    return out


def own_shm_files(store: Store) -> tuple[int, int, int]:
    """(semaphores, heap files, bytes they hold) of this process's own /dev/shm files, where
    ``store`` is on /dev/shm's file system; (0, 0, 0) elsewhere, or where it cannot be told."""
    try:
        if os.stat(store).st_dev != os.stat(SHM).st_dev:
            return 0, 0, 0
        with open("/proc/self/maps") as f:
            files = parse_shm_maps(f.read())
    except OSError:
        return 0, 0, 0
    page = os.sysconf("SC_PAGE_SIZE")
    sems = heaps = nbytes = 0
    for path in files.values():
        if path.rpartition("/")[2].startswith("sem."):
            sems += 1
        else:
            heaps += 1
        try:
            nbytes += os.stat(path).st_blocks * 512
        except OSError:  # a heap file is unlinked: its one touched page (two shared counters)
            nbytes += page
    return sems, heaps, nbytes


def describe(store: Store, *, segments: list[str] | None = None) -> str:
    """The store's free and total bytes, what this preparation holds of it (its ``segments``,
    in bytes allocated, and its own semaphores and heap files) and what the rest of it holds."""
    try:
        st = os.statvfs(store)
    except OSError as exc:
        return f"its size cannot be read ({exc.strerror})"
    size, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    seg_nbytes = 0
    for name in segments or ():
        try:
            seg_nbytes += os.lstat(store.path(name)).st_blocks * 512
        except OSError:
            pass
    sems, heaps, own_nbytes = own_shm_files(store)
    parts = [f"the snapshot's segments so far {seg_nbytes} bytes"]
    if sems or heaps:
        parts.append(
            f"its decode processes' {sems} POSIX semaphore(s) (/dev/shm/sem.*) and {heaps} shared-counter file(s) "
            f"{own_nbytes} bytes"
        )
    other = max(0, size - free - seg_nbytes - own_nbytes)
    return (
        f"{free} of its {size} bytes are free; this preparation holds {seg_nbytes + own_nbytes} bytes of it "
        f"({', '.join(parts)}); other files take {other} bytes"
    )
