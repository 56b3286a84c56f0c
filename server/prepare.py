"""Preparation: decode a dataset once into a float32 snapshot in shared memory.

Runs in the preparing process (``pixpool prepare``, the daemon at start-up), which owns
every segment it creates, plus a pool of spawned decode workers that attach the image
arena writable by name and write each centred image straight into its slice.

Order of work, and why:
1. Fingerprint the inputs (stat every image, hash annotation files and arrays). If a
   complete snapshot with that name exists, attach it and decode nothing.
2. Read every image's size from its header (Pillow; EXIF orientations 5-8 swap w/h) so the
   exact bytes are known before anything is decoded or allocated.
3. Refuse (CapacityError) if /dev/shm or available memory cannot hold the total.
4. Create meta, tgt, img (pages reserved up front, so a full /dev/shm fails here with
   ENOSPC and not later with SIGBUS); write the header (not complete), index and targets.
5. Decode in the pool, at most one transient image per record in flight per worker.
   Each worker checks the decoded size against the header size and names the file if
   they differ.
6. Write the completeness mark last.

All or nothing: any exception, Ctrl-C or SIGTERM (a handler raises while preparing)
terminates the pool and unlinks every segment created here before re-raising.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
import os
import signal
import threading
import time
from dataclasses import dataclass

import numpy as np
import psutil

from ..shared import layout
from ..shared.config import FILL_VALUE
from ..shared.errors import CapacityError, ImageDecodeError, MissingFileError, SnapshotError
from ..shared.names import SHM_DIR, shm_path
from ..shared.records import Dataset
from ..shared.shm import SharedSegment, unlink_segment
from . import decode
from .fingerprint import base_name, fingerprint, segment_names
from .snapshot import Snapshot, check_header, read_header

log = logging.getLogger(__name__)

_CHUNK = 4  # records per pool task: amortises IPC without holding many images


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

    def as_dict(self) -> dict:
        return {
            "snapshot": self.snapshot.name,
            "records": self.records,
            "image_bytes": self.image_bytes,
            "decoded_bytes": self.decoded_bytes,
            "target_bytes": self.target_bytes,
            "index_bytes": self.index_bytes,
            "reused": self.reused,
            "seconds": round(self.seconds, 4),
            "processes": self.processes,
        }


# -- image sizes from headers --------------------------------------------------------------
_SWAP_ORIENTATIONS = {5, 6, 7, 8}  # transposes: width and height trade places


def header_size_hw(path: str) -> tuple[int, int]:
    """(height, width) after EXIF orientation, from the file's header only (no decode)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            w, h = im.size
            # cv2's IMREAD_COLOR applies an EXIF orientation wherever the file carries one
            # (JPEG, PNG eXIf, WebP); a disagreement is caught after decoding, naming the file.
            orientation = im.getexif().get(0x0112, 1)
    except FileNotFoundError:
        raise MissingFileError("image file does not exist; check the images folder or the annotation's file_name", path=path) from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise ImageDecodeError(f"cannot read the image header ({exc}); replace or remove the file", path=path) from None
    if orientation in _SWAP_ORIENTATIONS:
        w, h = h, w
    return h, w


# -- decode workers (run in spawned processes, or in-process for processes=1) ---------------
_arenas: dict[str, SharedSegment] = {}  # in a worker: the arena it writes, attached on first use


def _watch_parent(parent_pid: int) -> None:
    """Die with the preparing process: a SIGKILLed parent must not leave workers mapping the arena."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux)
    except (OSError, AttributeError):  # pragma: no cover - non-Linux
        pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _worker_init(parent_pid: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and terminates us
    _watch_parent(parent_pid)
    import cv2  # noqa: F401  (imported by decode already; named here: this is the start-up cost)


def _noop() -> None:
    return None


def _decode_into(arena_buf, task: tuple, imgsz: int, fail_at: int | None) -> int:
    i, path, offset, h, w, oh, ow = task
    if fail_at is not None and i == fail_at:
        raise ImageDecodeError(f"injected failure at record {i} (fail_at)", path=path)
    image = decode.decode_bgr(path)
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
    out = np.frombuffer(arena_buf, dtype=np.float32, count=h * w * 3, offset=offset).reshape(h, w, 3)
    decode.centre(resized, out=out)
    return i


def _worker_chunk(args: tuple) -> int:
    arena_name, tasks, imgsz, fail_at = args
    arena = _arenas.get(arena_name)
    if arena is None:
        try:
            arena = _arenas[arena_name] = SharedSegment.attach(arena_name, writable=True)
        except FileNotFoundError:
            raise SnapshotError(
                f"segment {arena_name!r} vanished while being prepared: another process removed it "
                "(`pixpool clean --all`, or a test sweeping /dev/shm); prepare again"
            ) from None
    for task in tasks:
        _decode_into(arena.buf, task, imgsz, fail_at)
    return len(tasks)


# -- capacity ---------------------------------------------------------------------------------
def check_capacity(total_nbytes: int, *, imgsz: int) -> None:
    """CapacityError unless /dev/shm and available memory can both hold ``total_nbytes``."""
    st = os.statvfs(SHM_DIR)
    shm_free = st.f_bavail * st.f_frsize
    mem_free = psutil.virtual_memory().available
    if total_nbytes > shm_free:
        raise CapacityError(
            f"the snapshot needs {total_nbytes} bytes but {SHM_DIR} has {shm_free} bytes free; "
            f"use a smaller --imgsz (now {imgsz}), remove old snapshots with `pixpool clean`, "
            f"or enlarge {SHM_DIR} (docker: --shm-size; mount -o remount,size=...)"
        )
    if total_nbytes > mem_free:
        raise CapacityError(
            f"the snapshot needs {total_nbytes} bytes but only {mem_free} bytes of memory are available; "
            f"use a smaller --imgsz (now {imgsz}) or free memory"
        )


# -- reuse -------------------------------------------------------------------------------------
def _existing(base: str, names: dict[str, str]) -> Snapshot | None:
    """Attach a complete snapshot of this name; remove a stale incomplete one; raise if in progress."""
    present = [n for n in names.values() if os.path.exists(shm_path(n))]
    if not present:
        return None
    header = None
    if names["meta"] in present:
        try:
            header = read_header(names["meta"])
        except SnapshotError:
            header = None
    if header is not None and header.is_complete and len(present) == 3:
        check_header(base, header)
        return Snapshot.attach(base)
    from .accountant import segment_users

    users = segment_users()
    pids = sorted({p for n in present for p in users.get(n, ())} - {os.getpid()})
    if pids:
        creator = f" (creator pid {header.creator_pid})" if header is not None else ""
        raise SnapshotError(f"snapshot {base!r} is being prepared by live process(es) {pids}{creator}; wait for it to finish or stop it")
    log.warning("removing stale incomplete snapshot %s (segments %s)", base, present)
    for n in present:
        unlink_segment(n)
    return None


# -- the whole preparation ---------------------------------------------------------------------
def _plan(records, imgsz: int):
    """Index rows, instance/point totals and segment sizes, from image headers only."""
    header_cache: dict[str, tuple[int, int]] = {}
    index = np.zeros(len(records), dtype=layout.INDEX_DTYPE)
    offset = inst = pts = max_inst = 0
    for i, rec in enumerate(records):
        hw = header_cache.get(rec.image_path)
        if hw is None:
            hw = header_cache[rec.image_path] = header_size_hw(rec.image_path)
        rh, rw = decode.resized_hw(hw[0], hw[1], imgsz)
        k = len(rec.classes)
        index[i] = (offset, rh, rw, hw[0], hw[1], inst, k, pts)
        offset += layout.image_nbytes(rh, rw)
        inst += k
        pts += sum(len(p) for p in rec.polygons)
        max_inst = max(max_inst, k)
    sections = layout.target_sections(inst, pts)
    sizes = {"meta": layout.meta_nbytes(len(records)), "tgt": sections.nbytes, "img": offset}
    return index, sections, sizes, max_inst


def prepare_snapshot(
    dataset: Dataset,
    *,
    imgsz: int = 640,
    processes: int = 2,
    progress: bool = False,
    fail_at: int | None = None,
) -> PrepareResult:
    """Decode ``dataset`` into a snapshot (or re-attach an identical one); see module docstring."""
    t0 = time.perf_counter()
    if not isinstance(imgsz, int) or imgsz < 1:
        raise ValueError(f"imgsz must be a positive integer, got {imgsz!r}")
    if not isinstance(processes, int) or processes < 1:
        raise ValueError(f"processes must be a positive integer, got {processes!r}")
    records = dataset.records
    if not records:
        raise SnapshotError("the dataset has no records; nothing to prepare")
    fp = fingerprint(dataset, imgsz=imgsz)
    base = base_name(fp)
    names = segment_names(fp)
    existing = _existing(base, names)
    if existing is not None:
        return _result(existing, reused=True, seconds=time.perf_counter() - t0, processes=0)

    n = len(records)
    created: list[SharedSegment] = []
    pool = None
    old_term = None
    in_main = threading.current_thread() is threading.main_thread()
    if in_main:
        old_term = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        if processes > 1:
            # Start the workers now: their start-up (a fresh interpreter importing numpy and
            # cv2) overlaps the header reads and the allocation below.
            pool = _start_pool(processes)
        # Exact sizes from image headers, before decoding or allocating anything.
        index, sections, sizes, max_inst = _plan(records, imgsz)
        check_capacity(sum(sizes.values()), imgsz=imgsz)
        try:
            for part in ("meta", "tgt", "img"):
                created.append(SharedSegment.create(names[part], sizes[part]))
        except FileExistsError as exc:
            raise SnapshotError(f"snapshot {base!r} appeared while preparing ({exc.filename}): another process is preparing it") from None
        except OSError as exc:
            if exc.errno in (28, 12):  # ENOSPC, ENOMEM
                raise CapacityError(f"{SHM_DIR} could not reserve {sum(sizes.values())} bytes for snapshot {base!r} ({exc.strerror}); use a smaller --imgsz or enlarge {SHM_DIR}") from None
            raise
        meta, tgt, img = created
        header = layout.Header(
            magic=layout.MAGIC, layout_version=layout.LAYOUT_VERSION, complete=0, records=n, instances=sections.instances,
            points=sections.points, max_instances=max_inst, imgsz=imgsz, dtype_code=layout.FLOAT32_CODE, fill=float(FILL_VALUE),
            meta_nbytes=sizes["meta"], image_nbytes=sizes["img"], target_nbytes=sizes["tgt"],
            creator_pid=os.getpid(), created_unix=time.time(), fingerprint=fp,
        )  # fmt: skip
        meta.buf[: layout.HEADER_NBYTES] = layout.pack_header(header)
        layout.index_view(meta.buf, n)[:] = index
        layout.pack_targets(records, *layout.target_views(tgt.buf, sections))

        tasks = [(i, rec.image_path, int(index[i]["image_offset"]), int(index[i]["height"]), int(index[i]["width"]),
                  int(index[i]["orig_height"]), int(index[i]["orig_width"])) for i, rec in enumerate(records)]  # fmt: skip
        bar = _progress_bar(n, progress)
        try:
            if pool is None:
                for task in tasks:
                    _decode_into(img.buf, task, imgsz, fail_at)
                    bar.update(1)
            else:
                futures = [pool.submit(_worker_chunk, (names["img"], tasks[j : j + _CHUNK], imgsz, fail_at)) for j in range(0, n, _CHUNK)]
                try:
                    for fut in as_completed(futures):
                        bar.update(fut.result())
                except BrokenProcessPool as exc:
                    raise SnapshotError(
                        f"a decode process died or could not attach {names['img']!r} ({exc}); its traceback is above. "
                        "Was the segment removed by another process, or the worker killed for memory?"
                    ) from exc
                pool.shutdown(wait=True)
                pool = None
        finally:
            bar.close()
        for seg in created:
            seg.flush()
        # Everything else is written; only now does the snapshot become usable.
        meta.buf[layout.COMPLETE_OFFSET : layout.COMPLETE_OFFSET + 4] = layout.COMPLETE_MARK.to_bytes(4, "little")
        meta.flush()
    except BaseException:
        if in_main:  # a second SIGTERM must not cut the rollback short
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if pool is not None:
            _kill_pool(pool)
        for seg in created:
            seg.close()
            seg.unlink()
        raise
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, old_term if old_term is not None else signal.SIG_DFL)
    for seg in created:
        seg.close()
    snap = Snapshot(base, owner=True)
    return _result(snap, reused=False, seconds=time.perf_counter() - t0, processes=processes)


def _start_pool(processes: int) -> ProcessPoolExecutor:
    # concurrent.futures rather than multiprocessing.Pool: a worker that dies (OOM killer,
    # failing initializer) breaks the executor and raises here, where Pool would respawn
    # it and wait forever.
    ctx = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(processes, mp_context=ctx, initializer=_worker_init, initargs=(os.getpid(),))
    for _ in range(processes):  # each submit to an idle-less pool spawns one worker
        pool.submit(_noop)
    return pool


def _kill_pool(pool: ProcessPoolExecutor) -> None:
    """Stop the workers now: cancel queued chunks and terminate the processes mid-decode."""
    procs = list((getattr(pool, "_processes", None) or {}).values())  # no public API before 3.14
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
            p.join(timeout=10)


def _raise_terminated(signum, frame):
    raise PreparationTerminated("SIGTERM during preparation; every segment it created is being removed")


def _progress_bar(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, disable=not enabled, unit="img", desc="prepare", leave=False)


def _result(snap: Snapshot, *, reused: bool, seconds: float, processes: int) -> PrepareResult:
    index = snap.index
    decoded = int((index["height"].astype("i8") * index["width"].astype("i8") * 3).sum())
    nb = snap.nbytes
    return PrepareResult(
        snapshot=snap, reused=reused, seconds=seconds, records=len(snap), image_bytes=nb["img"],
        decoded_bytes=decoded, target_bytes=nb["tgt"], index_bytes=nb["meta"], processes=processes,
    )  # fmt: skip
