"""The decode side of preparation: claim the next record, decode, resize, write it into the arena.

Runs in the preparing process, which is always one of the decoders, and in the decode
workers that ``prepare.py`` starts (``processes - 1`` of them). The preparing
process creates and owns the image arena; a worker opens it by name to write its claimed
records and never unlinks it.

Work sharing: every decoder takes records one at a time from one shared counter
(``WorkShare``), so whichever process is free takes the next record. The preparing
process starts decoding at once while the workers are still starting (a spawned one, a
fresh interpreter importing numpy and cv2, takes 0.15-0.5 s), and a worker that starts late
simply finds fewer records left. A second counter, bumped after a record's bytes are
written, tells the preparing process when every record is in the arena.

Writing a uint8 snapshot: the resized image is written as it is, one ``pwrite`` per record
(nothing to convert: the arena holds the pixel). Writing a float32 snapshot: each decoder
centres a band of rows at a time (about 256 KB) into one reusable
float32 buffer of its own, then copies the band into the arena file with ``pwrite``; the
decoded and resized uint8 images are the only other transients it holds. On coco128
(455 MB of float32) this took 265 ms against 324 ms for centring straight into the
mapping and 294 ms for ``pwrite`` of whole images (medians of 7 alternating runs; the
kernel's allocation of the tmpfs pages is most of it whichever way they are written). It
also means a write into a full /dev/shm fails with ``ENOSPC`` (raised as CapacityError,
then rolled back), never with the SIGBUS a store through a mapping gets, which is why the
arena needs no up-front page reservation (see ``prepare.py``).

On a store with huge pages (``arena_pages``) every decoder instead maps the arena, populates
a record's pages (``MADV_POPULATE_WRITE``, which reports a full store as an error, never a
SIGBUS) and copies (uint8) or centres (float32) the resized image straight into them: there
two decoders no longer take turns on the arena file's inode lock, as every ``pwrite`` does.

Where a decoder's time goes (one 640x480 record, cv2.setNumThreads(1), on these 2-core
machines): imread ~1.6 ms; the pwrite ~0.34 ms per MB, nearly all of it the kernel
allocating tmpfs pages (1.2 ms for the 3.7 MB of a float32 record, 0.3 ms for the 0.9 MB
of a uint8 one); centring 0.13 ms. A plain imread + resize loop pays only the first, so
with two decoders a uint8 preparation can beat it by ~1.5x while a float32 one cannot
(``docs/benchmarks.md``, Preparation).

Import cost matters for a spawned worker: it imports this module first (to unpickle its
initializer), so only the standard library is imported at the top; the initializer limits
OpenBLAS to one thread before numpy is imported (numpy otherwise starts one BLAS thread per
core at import, which on a busy machine doubles a worker's start-up; the workers never
call BLAS), then imports ``decode`` (numpy, cv2).
"""

from __future__ import annotations

import errno
import fcntl
import importlib
import os
import signal
from contextlib import contextmanager
from types import ModuleType

# Already imported with this package (``server/snapshot/__init__``); no numpy at the top.
from ...shared.stream.config import DEFAULT_SNAPSHOT_DTYPE
from ...shared.transport.store import DEFAULT, Store

# Centred rows are written in bands of about this size: small enough that the band is still
# in the CPU cache when pwrite copies it (about 10% faster than whole images on coco128).
_BAND_NBYTES = 256 * 1024

# The module every decoder of a preparation reads its records' images with, passed as a
# module *name* (``prepare_snapshot(..., decoder=)``) so that it crosses the spawn boundary as
# a string, as the daemon's ``renderer=`` does. It provides ``decode_record(index, path) ->
# uint8 BGR (h, w, 3)``. The default is this module; tests pass a stand-in whose record 7
# fails as a corrupt image would (``tests/helpers/failing_decoder.py``).
DEFAULT_DECODER = __name__

# In a worker: set by ``worker_init``.
_share: "WorkShare | None" = None


class WorkShare:
    """Records claimed and records written, shared by every decoder of one preparation.

    With ``ctx`` (a multiprocessing context) the two counters live in shared memory
    (``RawArray``) and the object travels to spawned workers in their start-up arguments;
    without it (one process) a plain list does. Updates are serialised with ``flock`` on
    the arena file, which each decoder opens itself (``bind``): the kernel drops the lock
    of a process that dies holding it, so a killed worker can never wedge the others (a
    multiprocessing lock would stay taken), and no named semaphore is created.
    """

    def __init__(self, records: int, ctx=None):
        self.records = records
        self._counts = ctx.RawArray("q", 2) if ctx is not None else [0, 0]  # [next unclaimed, written]
        self._shared = ctx is not None
        self._lock_fd = -1  # this process's own descriptor of the arena (never pickled)

    def __getstate__(self) -> dict:
        return {"records": self.records, "_counts": self._counts, "_shared": self._shared}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock_fd=-1)

    def bind(self, fd: int) -> None:
        """Lock on ``fd``, a descriptor of the arena this process opened itself."""
        self._lock_fd = fd

    @contextmanager
    def _locked(self):
        if not self._shared or self._lock_fd < 0:  # one process, or not bound: nobody to race
            yield
            return
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def claim(self) -> int | None:
        """The next unclaimed record index, or None when all are taken (or after ``abort``)."""
        with self._locked():
            i = self._counts[0]
            if i >= self.records:
                return None
            self._counts[0] = i + 1
            return i

    def written(self) -> None:
        """Count one claimed record as fully written into the arena."""
        with self._locked():
            self._counts[1] += 1

    @property
    def claimed(self) -> int:
        """Records handed out so far (``records`` after ``abort``); read without the lock."""
        return min(self._counts[0], self.records)

    @property
    def done(self) -> int:
        """Records written so far, read without the lock (one aligned 8-byte load of a count
        that only grows): the preparing process polls it while workers update it."""
        return self._counts[1]

    def abort(self) -> None:
        """Stop every decoder after its current record: no claim succeeds any more."""
        with self._locked():
            self._counts[0] = self.records


class ArenaWriter:
    """Writes prepared images into the arena file at their offsets (one per decoder).

    ``dtype`` float32: each image is centred band by band into a reused buffer first;
    uint8: the resized image's own bytes are written as they are (nothing to convert).
    ``store``: the directory the arena lives in (``shared.transport.store``).
    ``mode`` (``arena_pages.write_mode``): ``pwrite`` through the descriptor, or ``mapping``
    on a huge-page store: each record's pages populated first, then the image copied (uint8)
    or centred (float32) straight into the mapped arena, no band buffer in between.
    """

    def __init__(
        self,
        arena_name: str,
        imgsz: int,
        dtype: str = DEFAULT_SNAPSHOT_DTYPE,
        store: Store = DEFAULT,
        mode: str = "pwrite",
    ):
        import numpy as np

        from ...shared.transport.shm import open_held
        from .arena_pages import MAPPING, PWRITE

        if mode not in (PWRITE, MAPPING):
            raise ValueError(f"ArenaWriter mode must be {PWRITE!r} or {MAPPING!r}, got {mode!r}")
        self.name = arena_name
        self.store = store
        try:
            # Held (shared.transport.holds): while a decoder writes the arena, it is in use.
            self.fd = open_held(arena_name, writable=True, store=store)
        except FileNotFoundError:
            from ...shared.errors import SnapshotError

            raise SnapshotError(
                f"segment {arena_name!r} vanished while being prepared: another process removed it "
                "(`rm`, or a test sweeping the store); prepare again"
            ) from None
        self.dtype = dtype
        self.mode = mode
        self._mm = None
        self._arena = None  # uint8 view of the whole mapping (mapping mode)
        self._buf = None
        if mode == MAPPING:
            import mmap

            self._mm = mmap.mmap(
                self.fd, os.fstat(self.fd).st_size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE
            )
            self._arena = np.frombuffer(self._mm, dtype=np.uint8)
        elif dtype == "float32":
            # one band: whole rows, about _BAND_NBYTES (at least one row of the widest image)
            self._buf = np.empty(max(_BAND_NBYTES // 4, imgsz * 3), dtype=np.float32)

    def write(self, resized, offset: int, path: str) -> None:
        """Write ``resized`` (uint8 h, w, 3) into the arena at ``offset``: as it is (uint8),
        or centred (float32)."""
        from . import decode

        if self._arena is not None:
            self._write_mapped(resized, offset, path)
            return
        if self._buf is None:
            import numpy as np

            self._pwrite_all(np.ascontiguousarray(resized), offset, path)
            return
        h, w = resized.shape[:2]
        row_nbytes = w * 3 * 4
        rows = max(1, _BAND_NBYTES // row_nbytes)
        for y in range(0, h, rows):
            band = resized[y : y + rows]
            out = self._buf[: band.shape[0] * w * 3].reshape(band.shape[0], w, 3)
            decode.centre(band, out=out)
            self._pwrite_all(out, offset + y * row_nbytes, path)

    def _write_mapped(self, resized, offset: int, path: str) -> None:
        import numpy as np

        from . import decode

        h, w = resized.shape[:2]
        itemsize = 4 if self.dtype == "float32" else 1
        nbytes = h * w * 3 * itemsize
        self._populate(offset, nbytes, path)
        dst = self._arena[offset : offset + nbytes]
        if itemsize == 1:
            np.copyto(dst.reshape(h, w, 3), resized)
        else:
            decode.centre(resized, out=dst.view(np.float32).reshape(h, w, 3))

    def _populate(self, offset: int, nbytes: int, path: str) -> None:
        """Allocate the pages of [offset, offset + nbytes) before storing into them, so that a
        full store is an error here and never a SIGBUS at the store (``arena_pages``)."""
        import mmap

        from . import arena_pages

        start = offset - offset % mmap.PAGESIZE
        try:
            arena_pages.populate(self._mm, start, offset + nbytes - start)
        except OSError as exc:
            if exc.errno in arena_pages.POPULATE_FULL_ERRNOS:
                self._raise_full(path, exc.strerror)
            raise

    def _pwrite_all(self, array, offset: int, path: str) -> None:
        view = memoryview(array).cast("B")
        pos = 0
        try:
            while pos < len(view):  # regular files write fully; loop in case a signal cuts one short
                pos += os.pwrite(self.fd, view[pos:], offset + pos)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.ENOMEM):
                self._raise_full(path, exc.strerror)
            raise
        finally:
            view.release()

    def _raise_full(self, path: str, reason: str) -> None:
        from ...shared.errors import CapacityError
        from ...shared.transport.names import parse, snapshot_parts
        from . import store_usage

        where = self.store
        parsed = parse(self.name)
        segments = (
            list(snapshot_parts(parsed.group).values()) if parsed is not None and parsed.kind == "snapshot" else []
        )
        # What the store holds now, this preparation's own files counted apart (its decode
        # processes' semaphores live in /dev/shm too): the numbers say who filled it.
        raise CapacityError(
            f"the store {where} ran out of space while writing the image of {path} ({reason}): "
            f"{store_usage.describe(where, segments=segments)}; free space in {where}, enlarge it, "
            "or use --dtype uint8 or a smaller --imgsz"
        ) from None

    def close(self) -> None:
        if self._mm is not None:
            self._arena = None  # mmap.close refuses while a view of the mapping exists
            try:
                self._mm.close()
            except BufferError:
                pass  # a failing record's view is still held by its traceback: unmapped once it dies
            self._mm = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def decode_record(index: int, path: str):
    """The image of record ``index``, read from ``path`` (``DEFAULT_DECODER``'s one function)."""
    from . import decode

    return decode.decode_bgr(path)


def decode_into(writer: ArenaWriter, job: tuple, imgsz: int, decoder: ModuleType) -> int:
    """Decode the record of ``job`` (index, path, arena offset, resized h, w, file h, w) with
    ``decoder`` (the module ``DEFAULT_DECODER`` names) and write it into the arena;
    ImageDecodeError names the file."""
    from ...shared.errors import ImageDecodeError
    from . import decode

    i, path, offset, h, w, oh, ow = job
    image = decoder.decode_record(i, path)
    if image.shape[:2] != (oh, ow):
        raise ImageDecodeError(
            f"decoded size {image.shape[1]}x{image.shape[0]} differs from the header size {ow}x{oh} used for allocation "
            "(EXIF orientation or a damaged header?); re-save the image",
            path=path,
        )
    resized = decode.resize_long_side(image, imgsz)
    del image
    if resized.shape[:2] != (h, w):  # pragma: no cover - resized_hw and cv2.resize disagree
        raise ImageDecodeError(f"resized to {resized.shape[:2]}, index says {(h, w)}", path=path)
    writer.write(resized, offset, path)
    return i


def decode_shared(
    share: WorkShare,
    arena_name: str,
    jobs: list,
    imgsz: int,
    after_each=None,
    dtype: str = DEFAULT_SNAPSHOT_DTYPE,
    store: Store = DEFAULT,
    mode: str = "pwrite",
    decoder: str = DEFAULT_DECODER,
) -> int:
    """Claim, decode and write records until none is left; the number this process wrote.

    On any failure every other decoder is told to stop (``share.abort``) before re-raising.
    ``after_each`` (the preparing process: progress and worker-failure checks) runs after
    every record written. ``decoder`` names the module that reads each image (``DEFAULT_DECODER``).
    """
    writer = None
    count = 0
    try:
        reader = importlib.import_module(decoder)
        writer = ArenaWriter(arena_name, imgsz, dtype, store, mode)
        share.bind(writer.fd)
        while (i := share.claim()) is not None:
            decode_into(writer, jobs[i], imgsz, reader)
            share.written()
            count += 1
            if after_each is not None:
                after_each()
    except BaseException:
        try:
            share.abort()
        except Exception:  # noqa: BLE001 - the original failure is the one to report
            pass
        raise
    finally:
        share.bind(-1)
        if writer is not None:
            writer.close()
    return count


# -- in a worker (spawned) -------------------------------------------------------------
def _watch_parent(parent_pid: int) -> None:
    """Die with the preparing process: a SIGKILLed parent must not leave workers writing the arena."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux)
    except (OSError, AttributeError):  # pragma: no cover - non-Linux
        pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _exit_without_teardown() -> None:
    # Last step of a worker's exit (multiprocessing has already run its own clean-up, the
    # arena descriptor is closed): skip the interpreter's module teardown with numpy and
    # cv2 loaded, about 35 ms that the preparing process would otherwise wait out in
    # ``shutdown(wait=True)``.
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed or broken stream: nothing left to save
            pass
    os._exit(0)


def worker_init(parent_pid: int, share: WorkShare) -> None:
    global _share
    import atexit

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and terminates us
    signal.signal(
        signal.SIGTERM, signal.SIG_DFL
    )  # terminate() must kill, whatever handler the parent's modules installed
    _watch_parent(parent_pid)
    atexit.register(_exit_without_teardown)
    os.environ["OPENBLAS_NUM_THREADS"] = "1"  # before numpy's first import (module docstring)
    from . import decode  # noqa: F401  (numpy and cv2: the worker's start-up cost)

    _share = share


def worker_started() -> None:
    """A no-op task: submitting one makes the executor spawn a worker now."""
    return None


def worker_decode(
    arena_name: str,
    jobs: list,
    imgsz: int,
    dtype: str = DEFAULT_SNAPSHOT_DTYPE,
    store: Store = DEFAULT,
    mode: str = "pwrite",
    decoder: str = DEFAULT_DECODER,
) -> int:
    """The one task each worker runs: share the records with the other decoders."""
    if _share is None:  # pragma: no cover - worker_init always runs first
        raise RuntimeError("worker_decode ran in a process that worker_init did not set up")
    return decode_shared(_share, arena_name, jobs, imgsz, dtype=dtype, store=store, mode=mode, decoder=decoder)
