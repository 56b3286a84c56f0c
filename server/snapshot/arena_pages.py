"""How the image arena is written: ``pwrite`` on a store of 4 KB pages, the mapping on huge pages.

Runs in the preparing process, which decides once per preparation (``write_mode``) and hands
the answer to every decoder, so all of them write the arena the same way.

Why it depends on the store's pages (measured on these 2-core machines, two processes
writing 1024-record arenas, ``docs/benchmarks.md``, "Preparation"):

- On /dev/shm (tmpfs, 4 KB pages) most of a write is the kernel allocating pages:
  ``pwrite`` costs ~0.42 ms of CPU per 0.9 MB uint8 record and ~1.9 ms per 3.7 MB float32
  one; the same bytes stored through a mapping cost about twice that (a fault, a zeroed
  page and a page-table entry per 4 KB, also with ``MADV_POPULATE_WRITE``). So ``pwrite``.
  Its cost: tmpfs takes the file's inode lock (``i_rwsem``) for every write, so two
  decoders writing the one arena file take turns, and the waiter spins on the lock.
- On a tmpfs mounted with huge pages (``mount -t tmpfs -o huge=always``, or ``within_size``)
  a 2 MB page costs one allocation: ``pwrite`` falls to ~0.15 / 0.45 ms per record, but
  the inode lock stays and under two writers doubles the CPU; through the mapping
  (``MADV_POPULATE_WRITE`` first) two decoders write in parallel, ~0.16 / 0.63 ms, and the
  centring and the uint8 copy write straight into the arena, with no band buffer between.

Writing through a mapping can SIGBUS when the store fills up (tmpfs has no page to give a
faulting store). ``MADV_POPULATE_WRITE`` (Linux 5.14) allocates a record's pages before a
byte is stored and reports a full store as an error instead (EFAULT, "a SIGBUS would have
been generated"), which the writer turns into the same CapacityError and rollback as an
ENOSPC from ``pwrite``; once populated, a tmpfs page is never taken back from the file.
So the mapping is chosen only where that call exists.

This is no advice to prepare into a huge-page store: a whole preparation there, where every
write follows a decode, measured no cheaper than one on /dev/shm (float32 dearer) on these
machines (``docs/benchmarks.md``). It makes such a store, where one is used, cheaper to write
than ``pwrite`` makes it.
"""

from __future__ import annotations

import errno
import mmap
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...shared.transport.store import Store

# linux/mman.h; Python's mmap module names it only from 3.13.
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
# Errors of MADV_POPULATE_WRITE that mean "no memory for these pages" (madvise(2)).
POPULATE_FULL_ERRNOS = (errno.EFAULT, errno.ENOMEM, errno.ENOSPC)

PWRITE = "pwrite"
MAPPING = "mapping"

_HUGE_OPTIONS = ("huge=always", "huge=within_size")
_SHMEM_ENABLED = "/sys/kernel/mm/transparent_hugepage/shmem_enabled"


def unescape_mount_path(field: str) -> str:
    """A path as /proc/self/mountinfo writes it (space, tab, newline, backslash as octal)."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def mount_of(mountinfo: str, path: str) -> tuple[str, str, str] | None:
    """(mount point, file-system type, super options) of the mount holding ``path`` (a real,
    absolute path), from the text of /proc/self/mountinfo; the last of equal mount points
    wins (it is the one on top). None if no line matches."""
    best = None
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        point = unescape_mount_path(fields[4])
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, tail[0], tail[2])
    return best


def huge_page_store(store: Store, *, mountinfo: str | None = None, shmem_enabled: str | None = None) -> bool:
    """Whether files in ``store`` get huge pages when written: a tmpfs mounted with
    ``huge=always`` or ``huge=within_size``, or any tmpfs while the kernel forces huge pages on
    all of them (``shmem_enabled`` "[force]"). ``mountinfo`` and ``shmem_enabled``: the text of
    those files (read here when None)."""
    if mountinfo is None:
        try:
            with open("/proc/self/mountinfo") as f:
                mountinfo = f.read()
        except OSError:
            return False
    found = mount_of(mountinfo, os.path.realpath(store))
    if found is None or found[1] != "tmpfs":
        return False
    if any(opt in found[2].split(",") for opt in _HUGE_OPTIONS):
        return True
    if shmem_enabled is None:
        try:
            with open(_SHMEM_ENABLED) as f:
                shmem_enabled = f.read()
        except OSError:
            return False
    return "[force]" in shmem_enabled


def populate(mm: mmap.mmap, start: int, nbytes: int) -> None:
    """Allocate the pages of ``mm[start:start + nbytes]`` for writing (``start`` page-aligned);
    OSError with one of ``POPULATE_FULL_ERRNOS`` where the store has no room for them."""
    mm.madvise(MADV_POPULATE_WRITE, start, nbytes)


def populate_supported() -> bool:
    """Whether this kernel knows ``MADV_POPULATE_WRITE`` (Linux 5.14+): tried on one
    anonymous page (EINVAL where it is unknown)."""
    mm = mmap.mmap(-1, mmap.PAGESIZE)
    try:
        mm.madvise(MADV_POPULATE_WRITE, 0, mmap.PAGESIZE)
    except OSError:
        return False
    finally:
        mm.close()
    return True


def write_mode(store: Store) -> str:
    """``MAPPING`` on a huge-page store where the kernel can populate pages ahead, else
    ``PWRITE`` (module docstring)."""
    return MAPPING if huge_page_store(store) and populate_supported() else PWRITE
