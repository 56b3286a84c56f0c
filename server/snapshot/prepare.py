"""Preparation: decode a dataset once into a snapshot (float32 centred, or uint8) in shared memory.

Runs in the preparing process (``pixpool prepare``, the daemon at start-up), which owns
every segment it creates and is itself one of the decoders, plus ``processes - 1``
spawned decode workers that open the image arena by name and write their records into
it (``decode_worker.py``: the decode side, work sharing, the write path).

Order of work, and why:
1. Fingerprint the inputs (stat every image, hash annotation files and arrays). If a
   complete snapshot of that fingerprint exists, attach it and decode nothing. Its name is
   derived from the fingerprint, the next derived one where another user's file sits under a
   name (``reuse.choose_base``).
2. Start the workers, with the spawn method like every worker of the service: a fresh
   interpreter importing numpy and cv2 takes 0.15-0.5 s and ~0.15 s of CPU. Fork would be
   ready in milliseconds, but the child would inherit OpenCV's and OpenBLAS's thread pools
   in whatever state the parent left them (CPython warns at such forks, gh-100228), and
   a preparation that can hang is worse than one that starts 0.2 s later. The start
   overlaps steps 3-6 and this process's own decoding; a worker dies with this process
   (``decode_worker.worker_init``).
3. Read every image's size from its header (Pillow; EXIF orientations 5-8 swap w/h) so the
   exact bytes are known before anything is decoded or allocated.
4. Refuse (CapacityError) if the store cannot hold the total (nor, for a store in memory
   such as /dev/shm, available memory; a disk store's pages are page cache the kernel may drop).
5. Create meta, tgt (pages reserved: they are written through this process's mapping, so
   a full /dev/shm must be ENOSPC here, never SIGBUS) and img (sized, not reserved, see
   below); write the header (not complete), index and targets.
6. Decode: this process and the workers take records one at a time from a shared counter
   until none is left, each holding one transient image at a time. Every decoder checks
   the decoded size against the header size and names the file if they differ. A worker
   still starting when the last record is claimed is terminated, not waited for.
7. Write the completeness mark last, once the shared count says every record is written.

Why the arena's pages are not reserved up front: reserving (``posix_fallocate``) 455 MB
for coco128 took 0.1-0.17 s in this process alone, before any decoding could start. It
did not touch memory twice (tmpfs allocates the pages then and zeroes or fills them at the
first write: reserve + write measured 0.31 s, write alone 0.34 s), it only made the
allocation one serial step; and it bought nothing the write path does not give anyway:
the arena is written only with
``pwrite``, which reports a full /dev/shm as ENOSPC (turned into CapacityError and rolled
back) and can never SIGBUS the way a store through a mapping can. A full /dev/shm is still
refused before anything is allocated or decoded (step 4); only a /dev/shm that another
process fills while this one decodes is found later, at the write, with the same error
and the same rollback. On a store with huge pages the decoders write through the mapping
instead (``arena_pages``): there each record's pages are populated first
(``MADV_POPULATE_WRITE``), which reports a full store as an error, never a SIGBUS, so the
same holds.

All or nothing: any exception (in this process or a worker), Ctrl-C or SIGTERM (a
handler raises while preparing) terminates the workers and unlinks every segment created
here before re-raising.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import signal
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import psutil

from ...shared.errors import CapacityError, ConfigError, DatasetError, SnapshotError
from ...shared.stream.config import DEFAULT_SNAPSHOT_DTYPE, FILL_VALUE, PrepareOptions
from ...shared.stream.records import Dataset
from ...shared.transport.names import snapshot_parts
from ...shared.transport.shm import SharedSegment
from ...shared.transport.store import DEFAULT, Store, free_nbytes, is_memory
from . import decode, layout, store_usage
from .arena_pages import write_mode
from .decode_worker import DEFAULT_DECODER, WorkShare, decode_shared, worker_decode, worker_init, worker_started
from .fingerprint import fingerprint
from .handle import Snapshot
from .headers import header_size_hw
from .reuse import BeingPrepared, choose_base, existing_snapshot, remove_superseded

log = logging.getLogger(__name__)

_POLL_S = 0.01  # waiting for the workers' last records: how often to look at the shared count


_WAIT_POLL_S = 0.1  # waiting for another process's preparation: how often to look again


class PreparationTerminated(BaseException):
    """SIGTERM arrived while preparing; raised by the handler so rollback runs."""


@dataclass
class PrepareResult:
    snapshot: Snapshot
    reused: bool
    seconds: float
    records: int
    image_bytes: int
    decoded_bytes: int
    target_bytes: int
    index_bytes: int
    processes: int
    dtype: str = DEFAULT_SNAPSHOT_DTYPE
    task: str = "detect"
    polygon_bytes: int = 0  # of target_bytes: the polygons (offsets and points)
    keypoint_bytes: int = 0  # of target_bytes: the keypoints and flip_idx (pose)

    def as_dict(self) -> dict:
        return {
            "snapshot": self.snapshot.name,
            "dtype": self.dtype,
            "task": self.task,
            "records": self.records,
            "image_bytes": self.image_bytes,
            "decoded_bytes": self.decoded_bytes,
            "target_bytes": self.target_bytes,
            "polygon_bytes": self.polygon_bytes,
            "keypoint_bytes": self.keypoint_bytes,
            "index_bytes": self.index_bytes,
            "reused": self.reused,
            "seconds": round(self.seconds, 4),
            "processes": self.processes,
        }


# -- capacity ---------------------------------------------------------------------------------
def _smaller(imgsz: int, dtype: str) -> str:
    """The cheaper snapshot, first: uint8 (made for this: a quarter of float32's bytes), then a smaller size."""
    cheaper = "--dtype uint8 (a quarter of the bytes of float32) or " if dtype == "float32" else ""
    return f"use {cheaper}a smaller --imgsz (now {imgsz})"


def check_budget(
    total_nbytes: int, budget_nbytes: int | None, *, what: str, imgsz: int, dtype: str = DEFAULT_SNAPSHOT_DTYPE
) -> None:
    """CapacityError if a snapshot of ``total_nbytes`` exceeds the memory budget."""
    if budget_nbytes is not None and total_nbytes > budget_nbytes:
        raise CapacityError(
            f"{what} takes {total_nbytes} bytes, over the memory budget of {budget_nbytes} bytes; "
            f"{_smaller(imgsz, dtype)}, or raise the budget (--memory-budget, memory_budget_nbytes)"
        )


def check_capacity(
    total_nbytes: int, *, imgsz: int, dtype: str = DEFAULT_SNAPSHOT_DTYPE, store: Store = DEFAULT
) -> None:
    """CapacityError unless the store (and, for a store in memory, available memory) can hold ``total_nbytes``."""
    shm_free = free_nbytes(store)
    if total_nbytes > shm_free:
        memory = is_memory(store)
        sems, heaps, own = store_usage.own_shm_files(store)
        held = (
            f" (its decode processes' {sems} POSIX semaphore(s) and {heaps} shared-counter file(s) in /dev/shm "
            f"already hold {own} bytes of it)"
            if sems or heaps
            else ""
        )
        raise CapacityError(
            f"the snapshot needs {total_nbytes} bytes but the store {store} has {shm_free} bytes free{held}; "
            f"{_smaller(imgsz, dtype)}, remove old snapshots with `pixpool clean`, "
            + (
                f"put the snapshot on a local disk (--store DIR) or enlarge {store} (docker: --shm-size; mount -o remount,size=...)"
                if memory
                else "or choose a --store with more room"
            )
        )
    if not is_memory(store):
        return  # page cache: the kernel reads back what it drops, no need to fit in memory
    mem_free = psutil.virtual_memory().available
    if total_nbytes > mem_free:
        raise CapacityError(
            f"the snapshot needs {total_nbytes} bytes but only {mem_free} bytes of memory are available; "
            f"{_smaller(imgsz, dtype)}, put the snapshot on a local disk (--store DIR), or free memory"
        )


def _allocated_nbytes(sizes: dict[str, int], store: Store) -> int:
    """What segments of ``sizes`` take in ``store``: each a whole number of its blocks (a
    tmpfs page, a huge page), so that a snapshot that passes the capacity check also fits
    at the last page of its last write."""
    block = os.statvfs(store).f_frsize or 1
    return sum(-(-nbytes // block) * block for nbytes in sizes.values())


# -- the whole preparation ---------------------------------------------------------------------
def _plan(
    records,
    imgsz: int,
    itemsize: int = 4,
    kpt_count: int = 0,
    flip_count: int = 0,
    header_sizes: dict[str, tuple[int, int]] | None = None,
):
    """Index rows, instance/point totals and segment sizes, from image headers only
    (``kpt_count`` keypoints per instance and ``flip_count`` flip entries: the pose task's K or 0).
    ``header_sizes``: image path -> (h, w) already read (``planning.read_header_sizes``); a path
    not in it is read here. With every size given this is pure arithmetic: ``pixpool plan`` and
    the daemon's check at start-up size a snapshot with it, so the sizes they say are these."""
    header_cache: dict[str, tuple[int, int]] = dict(header_sizes or {})
    index = np.zeros(len(records), dtype=layout.INDEX_DTYPE)
    offset = inst = pts = max_inst = 0
    for i, rec in enumerate(records):
        hw = header_cache.get(rec.image_path)
        if hw is None:
            hw = header_cache[rec.image_path] = header_size_hw(rec.image_path)
        if rec.size_hw is not None and tuple(rec.size_hw) != tuple(hw):
            # The labels are normalised by the annotation's size: a different image (or an
            # EXIF rotation the annotation did not apply) would misplace every box.
            raise DatasetError(
                f"the annotation says {rec.size_hw[1]}x{rec.size_hw[0]} (width x height) but the image is {hw[1]}x{hw[0]} "
                "after its EXIF orientation; fix the annotation's width/height or the image",
                path=rec.image_path,
            )
        rh, rw = decode.resized_hw(hw[0], hw[1], imgsz)
        k = len(rec.classes)
        index[i] = (offset, rh, rw, hw[0], hw[1], inst, k, pts)
        offset += layout.image_nbytes(rh, rw, itemsize=itemsize)
        inst += k
        pts += sum(len(p) for p in rec.polygons)
        max_inst = max(max_inst, k)
    sections = layout.target_sections(inst, pts, kpt_count, flip_count)
    sizes = {"meta": layout.meta_nbytes(len(records)), "tgt": sections.nbytes, "img": offset}
    return index, sections, sizes, max_inst


def prepare_snapshot(
    dataset: Dataset,
    options: PrepareOptions | None = None,
    *,
    progress: bool = False,
    lineage: str | None = None,
    decoder: str = DEFAULT_DECODER,
    header_sizes: dict[str, tuple[int, int]] | None = None,
) -> PrepareResult:
    """Decode ``dataset`` into a snapshot (or re-attach an identical one); see module docstring.

    ``options`` (``DaemonConfig.prepare_options()``; default ``PrepareOptions()``) were
    validated when they were made. ``options.store`` is the directory the segments go in
    (``shared.store``), checked before anything else. ``keep_snapshot`` marks a new snapshot to
    stay in the store until ``pixpool clean`` (no process removes it on exit). ``lineage``
    (``fingerprint.lineage_of``) names where the dataset came from: once a new snapshot of that
    lineage is complete, older ones of the same lineage that nobody maps are removed, since
    their inputs have changed since. While another live process prepares the same snapshot,
    this one waits up to ``prepare_wait_s`` for it and attaches the result.
    ``memory_budget_nbytes`` is the most the snapshot may take: a larger one is refused before
    anything is allocated, or not re-attached. ``dtype`` (``config.SNAPSHOT_DTYPES``) is the
    arena's pixel type: ``float32`` centred, or ``uint8`` (the same integers + the fill, a
    quarter of the bytes); it is part of the fingerprint, so only a snapshot of the same dtype
    is re-attached. ``decoder`` names the module whose ``decode_record(index, path)`` reads each
    record's image, in this process and in every decode worker (``decode_worker.DEFAULT_DECODER``;
    tests pass a stand-in that fails at one record). ``header_sizes``: image path -> (h, w) from
    the headers, where the caller has read them (the daemon's check at start-up, ``planning.py``);
    a file that changed since is caught by the decoder's size check, naming it."""
    t0 = time.perf_counter()
    if options is None:
        options = PrepareOptions()
    elif not isinstance(options, PrepareOptions):
        raise TypeError(
            f"prepare_snapshot takes PrepareOptions (DaemonConfig.prepare_options()), got {type(options).__name__}"
        )
    store = options.segment_store.checked()
    options = dataclasses.replace(options, store=store.directory)
    records = dataset.records
    if not records:
        raise SnapshotError("the dataset has no records; nothing to prepare")
    if dataset.task != options.task:
        raise ConfigError.for_field(
            "task",
            options.task,
            f"differs from the task the dataset was read for ({dataset.task!r}); read it with "
            f"task={options.task!r} (load_dataset(..., task=...)) or prepare with task={dataset.task!r}",
        )
    fp = fingerprint(dataset, imgsz=options.imgsz, dtype=options.dtype)
    deadline = time.monotonic() + options.prepare_wait_s
    told = False
    reported: set = set()  # planted files already logged by this call
    while True:
        try:
            # Chosen again at every try: a name another user took while this process waited
            # is passed over, and the snapshot another process made is found under its name.
            base = choose_base(fp, store=store, reported=reported)
            names = snapshot_parts(base)
            existing = existing_snapshot(base, names, store=store)
            if existing is not None:
                try:
                    check_budget(
                        sum(existing.nbytes.values()),
                        options.memory_budget_nbytes,
                        what=f"the existing snapshot {base}",
                        imgsz=options.imgsz,
                        dtype=options.dtype,
                    )
                except CapacityError:
                    existing.close()
                    raise
                return _result(existing, reused=True, seconds=time.perf_counter() - t0, processes=0)
            build = _Build(dataset, options, fp=fp, base=base, names=names, lineage=lineage, decoder=decoder)
            build.header_sizes = header_sizes  # read already by the daemon's check at start-up, or None
            snap = build.run(progress=progress)
            return _result(snap, reused=False, seconds=time.perf_counter() - t0, processes=options.processes)
        except BeingPrepared as exc:
            # Another process prepares the same snapshot: wait for it and attach its
            # result rather than fail (or decode everything a second time).
            if time.monotonic() >= deadline:
                raise SnapshotError(
                    f"{exc}; waited {options.prepare_wait_s} s for it to finish (raise prepare_wait_s, or stop that process)"
                ) from None
            if not told:
                log.info("%s; waiting for it (up to %.0f s) to attach its snapshot", exc, options.prepare_wait_s)
                told = True
            time.sleep(_WAIT_POLL_S)  # polling interval of a bounded wait for the other preparation


@dataclass
class _Plan:
    """What a new snapshot will hold, from image headers alone (``_plan``)."""

    index: np.ndarray
    sections: layout.TargetSections
    sizes: dict[str, int]  # meta, tgt, img -> bytes
    max_instances: int

    @property
    def nbytes(self) -> int:
        return sum(self.sizes.values())


class _Build:
    """A new snapshot under ``base`` (module docstring, steps 2-7), one named step each.

    ``run`` takes the steps in order inside ``_preparing``, which rolls back (``rollback``)
    what the steps created so far when any of them fails or the process is told to stop."""

    def __init__(
        self,
        dataset: Dataset,
        options: PrepareOptions,
        *,
        fp: str,
        base: str,
        names: dict[str, str],
        lineage: str | None,
        decoder: str,
    ):
        self.dataset, self.options, self.fp, self.base, self.names, self.lineage = (
            dataset, options, fp, base, names, lineage
        )  # fmt: skip
        self.decoder = decoder
        self.header_sizes: dict[str, tuple[int, int]] | None = None
        self.records = dataset.records
        self.store = options.segment_store
        self.workers = min(options.processes, len(self.records)) - 1  # the preparing process is one of the decoders
        self.code = layout.CODE_OF[options.dtype]
        self.created: list[SharedSegment] = []
        self.pool: ProcessPoolExecutor | None = None

    def run(self, *, progress: bool) -> Snapshot:
        with _preparing(self.rollback):
            share = self.start_decoders()
            plan = self.plan()
            self.allocate(plan)
            self.decode(plan, share, progress=progress)
            self.install()
        # Attach before closing the creator's mappings, so that at no moment does no process
        # map the finished snapshot (leak checks treat unmapped new segments as orphans).
        snap = Snapshot(self.base, owner=True, store=self.store)
        for seg in self.created:
            seg.close()
        if self.lineage:
            remove_superseded(self.lineage, keep=self.base, store=self.store)
        return snap

    def start_decoders(self) -> WorkShare:
        """Step 2: the workers start first, so that their start-up overlaps the header reads,
        the allocation and this process's own decoding of the first records."""
        n = len(self.records)
        if self.workers <= 0:
            return WorkShare(n)
        ctx = decode_context()
        share = WorkShare(n, ctx)
        self.pool = _start_pool(ctx, self.workers, share)
        return share

    def plan(self) -> _Plan:
        """Steps 3-4: exact sizes from image headers, checked against the budget and the store
        before anything is decoded or allocated."""
        opts, ds = self.options, self.dataset
        keypoints = ds.spec.has_keypoints
        kpt_count = ds.kpt_shape[0] if keypoints else 0
        flip_count = len(ds.flip_idx) if keypoints and ds.flip_idx is not None else 0
        itemsize = layout.DTYPE_CODES[self.code].itemsize
        plan = _Plan(*_plan(self.records, opts.imgsz, itemsize, kpt_count, flip_count, self.header_sizes))
        what = f"the snapshot of {len(self.records)} records"
        check_budget(plan.nbytes, opts.memory_budget_nbytes, what=what, imgsz=opts.imgsz, dtype=opts.dtype)
        check_capacity(_allocated_nbytes(plan.sizes, self.store), imgsz=opts.imgsz, dtype=opts.dtype, store=self.store)
        return plan

    def allocate(self, plan: _Plan) -> None:
        """Step 5: the three segments, then the header (not complete), index and targets."""
        opts, names = self.options, self.names
        try:
            for part in ("meta", "tgt", "img"):
                # meta and tgt are written through this process's mapping: their pages are
                # reserved now so a full /dev/shm is ENOSPC here, never SIGBUS later. The
                # arena is written with pwrite, or through a mapping whose pages are
                # populated first, both of which report a full store (module docstring).
                self.created.append(
                    SharedSegment.create(names[part], plan.sizes[part], reserve=(part != "img"), store=self.store)
                )
        except FileExistsError as exc:
            raise BeingPrepared(
                f"snapshot {self.base!r} appeared while preparing ({exc.filename}): another process is preparing it"
            ) from None
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.ENOMEM):
                raise CapacityError(
                    f"the store {self.store} could not reserve {plan.nbytes} bytes for snapshot {self.base!r} "
                    f"({exc.strerror}); {_smaller(opts.imgsz, opts.dtype)}, choose another --store or enlarge {self.store}"
                ) from None
            raise
        meta, tgt, _ = self.created
        n, sections, sizes = len(self.records), plan.sections, plan.sizes
        header = layout.Header(
            magic=layout.MAGIC, layout_version=layout.LAYOUT_VERSION, complete=0, records=n, instances=sections.instances,
            points=sections.points, max_instances=plan.max_instances, imgsz=opts.imgsz, dtype_code=self.code,
            fill=float(FILL_VALUE), meta_nbytes=sizes["meta"], image_nbytes=sizes["img"], target_nbytes=sizes["tgt"],
            creator_pid=os.getpid(), created_unix=time.time(), fingerprint=self.fp, persist=int(bool(opts.keep_snapshot)),
            lineage=self.lineage or "", task_code=layout.TASK_CODE_OF[self.dataset.task], kpt_count=sections.kpt_count,
            kpt_dims=self.dataset.kpt_shape[1] if sections.kpt_count else 0, flip_count=sections.flip_count,
        )  # fmt: skip
        meta.buf[: layout.HEADER_NBYTES] = layout.pack_header(header)
        layout.index_view(meta.buf, n)[:] = plan.index
        layout.pack_targets(self.records, *layout.target_views(tgt.buf, sections))
        if sections.kpt_count:
            keypoints, flip = layout.keypoint_views(tgt.buf, sections)
            layout.pack_keypoints(self.records, keypoints)
            if sections.flip_count:
                flip[:] = self.dataset.flip_idx
            del keypoints, flip  # views of the creator's mapping: it is closed once the snapshot is attached

    def decode(self, plan: _Plan, share: WorkShare, *, progress: bool) -> None:
        """Step 6: this process and the workers decode every record into the arena; the
        workers are stopped once the last record is written."""
        opts, arena, index = self.options, self.names["img"], plan.index
        mode = write_mode(self.store)  # the same for every decoder (arena_pages)
        jobs = [(i, rec.image_path, int(index[i]["image_offset"]), int(index[i]["height"]), int(index[i]["width"]),
                  int(index[i]["orig_height"]), int(index[i]["orig_width"])) for i, rec in enumerate(self.records)]  # fmt: skip
        bar = _progress_bar(len(self.records), progress)
        try:
            futures = (
                [
                    self.pool.submit(worker_decode, arena, jobs, opts.imgsz, opts.dtype, self.store, mode, self.decoder)
                    for _ in range(self.workers)
                ]
                if self.pool
                else []
            )

            def after_each() -> None:
                _raise_worker_failure(futures, arena)
                bar.update(share.done - bar.n)

            decode_shared(
                share,
                arena,
                jobs,
                opts.imgsz,
                after_each,
                dtype=opts.dtype,
                store=self.store,
                mode=mode,
                decoder=self.decoder,
            )
            _wait_for_workers(share, futures, bar, arena)
        finally:
            bar.close()
        if self.pool is not None:
            _stop_pool(self.pool, futures)
            self.pool = None

    def install(self) -> None:
        """Step 7: everything else is written; only now does the snapshot become usable."""
        for seg in self.created:
            seg.flush()
        meta = self.created[0]
        meta.buf[layout.COMPLETE_OFFSET : layout.COMPLETE_OFFSET + 4] = layout.COMPLETE_MARK.to_bytes(4, "little")
        meta.flush()

    def rollback(self) -> None:
        """Remove every segment created so far and stop the workers (all or nothing)."""
        # Unlink first: a worker keeps its own descriptor and can finish writing into an
        # unlinked file harmlessly, while stopping the pool may take seconds.
        for seg in self.created:
            seg.close()
            seg.unlink()
        if self.pool is not None:
            _kill_pool(self.pool)


@contextmanager
def _preparing(rollback: Callable[[], None]) -> Iterator[None]:
    """While preparing, SIGTERM raises ``PreparationTerminated``; on any exception
    ``rollback`` runs with SIGTERM and SIGINT ignored (a second signal must not cut it short),
    then the exception goes on. Every handler is restored on the way out. Outside the main
    thread, where Python sets no handlers, only the rollback."""
    in_main = threading.current_thread() is threading.main_thread()
    old_term = signal.signal(signal.SIGTERM, _raise_terminated) if in_main else None
    try:
        yield
    except BaseException:
        old_int = None
        if in_main:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            rollback()
        finally:
            if in_main:
                signal.signal(signal.SIGINT, old_int if old_int is not None else signal.default_int_handler)
        raise
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, old_term if old_term is not None else signal.SIG_DFL)


def decode_context():
    """The multiprocessing context the decode workers start with: spawn (module docstring,
    step 2), the working directory kept off their ``sys.path`` (``shared.transport.spawn``)."""
    from ...shared.transport.spawn import spawn_context

    return spawn_context()


def _start_pool(ctx, workers: int, share: WorkShare) -> ProcessPoolExecutor:
    # concurrent.futures rather than multiprocessing.Pool: a worker that dies (OOM killer,
    # failing initializer) breaks the executor and raises here, where Pool would respawn
    # it and wait forever.
    pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=worker_init, initargs=(os.getpid(), share))
    for _ in range(workers):  # each submit to a pool without an idle worker starts one
        pool.submit(worker_started)
    return pool


def _raise_worker_failure(futures: list, arena_name: str) -> None:
    """Re-raise, here, the first failure of a worker (its traceback is printed as the cause)."""
    for fut in futures:
        if fut.done() and fut.exception() is not None:
            try:
                fut.result()
            except BrokenProcessPool as exc:
                raise SnapshotError(
                    f"a decode process died ({exc}); its traceback, if any, is above. "
                    f"Was it killed for memory, or was {arena_name!r} removed by another process?"
                ) from exc


def _wait_for_workers(share: WorkShare, futures: list, bar, arena_name: str) -> None:
    """Return once every record is written; raise the first worker failure meanwhile.

    A worker still starting when the last record was claimed holds no record, so this
    waits only for the records the workers are writing, not for their start-up.
    """
    while share.done < share.records:
        wait(futures, timeout=_POLL_S, return_when=FIRST_EXCEPTION)
        _raise_worker_failure(futures, arena_name)
        bar.update(share.done - bar.n)
        if (
            all(f.done() for f in futures) and share.done < share.records
        ):  # pragma: no cover - a claim is always written or raises
            raise SnapshotError(
                f"decode workers finished with {share.records - share.done} record(s) of {arena_name!r} unwritten"
            )


def _stop_pool(pool: ProcessPoolExecutor, futures: list) -> None:
    """After success: let idle workers exit; terminate those still starting (they hold no record)."""
    if all(f.done() for f in futures):
        # Waits for them to exit (about 30 ms of interpreter teardown, measured): no decode
        # process outlives the call, and the executor's queues are released here, not at
        # some later garbage collection.
        pool.shutdown(wait=True)
    else:
        _kill_pool(pool)


def _kill_pool(pool: ProcessPoolExecutor) -> None:
    """Stop the workers now: cancel queued tasks and terminate the processes mid-decode."""
    procs = list((getattr(pool, "_processes", None) or {}).values())  # no public API before 3.14
    manager = getattr(pool, "_executor_manager_thread", None)
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
            p.join(timeout=10)
    if manager is not None:  # it notices the dead workers and exits, releasing the queues
        manager.join(timeout=10)


def _raise_terminated(signum, frame):
    raise PreparationTerminated("SIGTERM during preparation; every segment it created is being removed")


def _progress_bar(total: int, enabled: bool):
    from tqdm import tqdm

    class _Bar(tqdm):
        # No monitor thread: tqdm would start one at the first bar and keep it for the life
        # of the process (a thread nobody needs in a daemon).
        monitor_interval = 0
        # A thread lock: tqdm's default adds a multiprocessing lock, a POSIX semaphore file in
        # /dev/shm made at the first bar, after the capacity check, whose page a snapshot that
        # fits to the page in /dev/shm would miss at its last write. Only this process draws bars.
        _lock = threading.RLock()

    return _Bar(total=total, disable=not enabled, unit="img", desc="prepare", leave=False)


def _result(snap: Snapshot, *, reused: bool, seconds: float, processes: int) -> PrepareResult:
    decoded = snap.decoded_nbytes
    nb = snap.nbytes
    return PrepareResult(
        snapshot=snap, reused=reused, seconds=seconds, records=len(snap), image_bytes=nb["img"],
        decoded_bytes=decoded, target_bytes=nb["tgt"], index_bytes=nb["meta"], processes=processes, dtype=snap.dtype,
        task=snap.task, polygon_bytes=snap.polygon_nbytes, keypoint_bytes=snap.keypoint_nbytes,
    )  # fmt: skip
