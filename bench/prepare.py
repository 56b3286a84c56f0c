"""bench/prepare.py: what preparing a snapshot costs, against a plain loop of cv2.imread + resize.

Five questions (``--what``), all run in the shell process (and the decode workers it starts):

- ``speed`` (default): ``prepare_snapshot`` (float32 and uint8, 1 and 2 processes, per store
  and write mode) against a single-process loop of ``cv2.imread`` + resize over the same files,
  every arm in one run, alternating. Every prepare starts from nothing (its snapshot is
  unlinked right after; the dataset carries a marker file of this run, so no other snapshot is
  reused or removed). Medians over rounds as ratios against the loop ("vs loop": of the
  medians; "paired": the median of the per-round ratios), and the CPU seconds (user + system,
  this process and its decode workers), which a busy machine inflates far less than the wall.
  ``--copies K`` copies every image file K times (coco128 x 8 = 1024 distinct files, as a
  1024-image dataset has); ``--repeat K`` lists every record K times instead.
- ``stages``: each step of a preparation alone in this process, CPU ms per image (header read,
  the loop's imread, the decoder's decode, resize, centring, the arena write through
  ``pwrite`` and through a mapping into a scratch file in the store), and the floor two
  decoders on two cores reach from those steps.
- ``writers``: two forked processes writing 512 records (0.9 MB uint8, 3.7 MB float32) into
  the store four ways: ``pwrite`` into one shared file (the arena) or a file per writer, a
  shared mapping as it faults or after ``MADV_POPULATE_WRITE`` (``ArenaWriter`` on huge pages).
  On tmpfs every ``pwrite`` takes the file's inode lock.
- ``decode-warnings``: what catching libjpeg's warnings costs per decoded image: ``cv2.imread``
  alone against the same call inside ``capture_fd2`` plus the scan (``decode_bgr``), same bytes.
- ``labels``: reading YOLO label files, refused and accepted, a fresh interpreter per case (so
  each peak RSS is that case's): a label file of ``--lines`` box lines, one line with class id
  ``--class-id``, and coco128's labels read whole (median of ``--rounds``).

    python bench/prepare.py --what speed [--copies 8] [--rounds 5] [--store DIR[,DIR]] [--write-modes pwrite,mapping]
    python bench/prepare.py --what stages --copies 8 --rounds 3 [--store DIR]
    python bench/prepare.py --what writers --rounds 3 [--store DIR]
    python bench/prepare.py --what decode-warnings [--rounds 5]
    python bench/prepare.py --what labels [--lines 1000000] [--class-id 1000000]
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import mmap
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:  # the helpers beside this file, under python -P too
    sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402

_BAND_NBYTES = 256 * 1024  # float32 records are centred and written in bands, as ArenaWriter does


# -- the files ----------------------------------------------------------------------------------------
def _data_args(p) -> None:
    p.add_argument("--data", default=str(common.COCO128_JSON))
    p.add_argument("--images", default=str(common.COCO128_IMAGES))
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds")
    p.add_argument("--repeat", type=int, default=1, help="list every record K times")
    p.add_argument("--copies", type=int, default=1, help="copy every image file K times, each a record of its own")
    p.add_argument("--store", default="/dev/shm", help="the store, or several comma-separated (speed: an arm each)")


def files(args, folder: str):
    """The dataset of ``args`` (copied or repeated), under a fingerprint of this run's own, its
    files read once (into the page cache) before anything is timed."""
    from pixpool.server.readers import load_dataset
    from pixpool.shared.stream.records import Dataset

    if min(args.repeat, args.rounds, args.copies) < 1:
        raise SystemExit("--repeat, --copies and --rounds must be >= 1")
    dataset = load_dataset(args.data, args.images)
    records = []
    for k in range(args.copies):
        for i, rec in enumerate(dataset.records):
            path = rec.image_path
            if args.copies > 1:
                path = os.path.join(folder, f"{k}_{i:06d}{Path(rec.image_path).suffix}")
                shutil.copyfile(rec.image_path, path)
            records.append(dataclasses.replace(rec, image_path=path))
    # One extra source file naming this run: the snapshots here neither reuse nor remove another's.
    marker = Path(folder) / "bench-prepare-marker.txt"
    marker.write_text(f"bench/prepare.py pid {os.getpid()} at {time.time()!r}\n")
    dataset = Dataset(tuple(records) * args.repeat, dataset.names, (*dataset.source_files, str(marker)))
    for r in dataset.records:
        Path(r.image_path).read_bytes()
    return dataset


# -- speed ----------------------------------------------------------------------------------------------
def plain_loop(paths: list[str], imgsz: int) -> tuple[float, float]:
    import cv2

    from pixpool.server.snapshot.decode import resize_long_side

    c0, t0 = common.cpu_s(children=True), time.perf_counter()
    for p in paths:
        resize_long_side(cv2.imread(p, cv2.IMREAD_COLOR), imgsz)
    return time.perf_counter() - t0, common.cpu_s(children=True) - c0


def prepare_once(dataset, imgsz: int, processes: int, dtype: str, store: str, mode: str) -> tuple[float, float]:
    """(wall s, CPU s) of one preparation from nothing; ``mode`` forces the arena's write path."""
    from pixpool.server.snapshot import prepare
    from pixpool.server.snapshot.prepare import PrepareOptions, prepare_snapshot

    chosen = prepare.write_mode
    if mode != "auto":  # the preparing process hands its mode to the decode workers
        prepare.write_mode = lambda _store: mode
    try:
        c0, t0 = common.cpu_s(children=True), time.perf_counter()
        result = prepare_snapshot(dataset, PrepareOptions(imgsz=imgsz, processes=processes, dtype=dtype, store=store))
        seconds, cpu = time.perf_counter() - t0, common.cpu_s(children=True) - c0  # decode workers reaped by now
    finally:
        prepare.write_mode = chosen
    result.snapshot.close()
    if result.reused:  # someone else's snapshot: never remove it
        raise RuntimeError(f"{result.snapshot.name} was reused, so nothing was timed; remove it (pixpool clean)")
    result.snapshot.unlink()
    return seconds, cpu


def speed_main(argv: list[str]) -> int:
    """Preparation against the plain loop, arm against arm (module docstring, ``speed``)."""
    p = common.parser(speed_main.__doc__, "prepare.py --what speed")
    _data_args(p)
    p.add_argument("--dtypes", default="float32,uint8")
    p.add_argument("--processes", default="1,2", help="decoder process counts")
    p.add_argument("--write-modes", default="auto", help="auto (what the store gets), pwrite, mapping: an arm each")
    args = p.parse_args(argv)
    modes = args.write_modes.split(",")
    if set(modes) - {"auto", "pwrite", "mapping"}:
        p.error(f"--write-modes takes auto, pwrite and mapping, got {args.write_modes!r}")
    import cv2

    from pixpool.server.snapshot.arena_pages import write_mode

    cv2.setNumThreads(1)
    stores = args.store.split(",")
    with tempfile.TemporaryDirectory(prefix="pxbench-prepare-") as folder:
        dataset = files(args, folder)
        paths = [r.image_path for r in dataset.records]
        loop = "cv2.imread + resize loop (1 core)"
        arms = {loop: lambda: plain_loop(paths, args.imgsz)}
        for dtype in args.dtypes.split(","):
            for n in map(int, args.processes.split(",")):
                for store in stores:
                    for mode in modes:
                        name = f"prepare {dtype}, {n} process{'es' if n > 1 else ''}"
                        name += (f", {store}" if len(stores) > 1 else "") + ("" if mode == "auto" else f", {mode}")
                        arms[name] = lambda n=n, dtype=dtype, store=store, mode=mode: prepare_once(
                            dataset, args.imgsz, n, dtype, store, mode
                        )
        before = common.load()
        got = common.rounds(arms, args.rounds)
    how = f"x{args.copies} copies" if args.copies > 1 else f"x{args.repeat}"
    print(f"`{args.command}`\n\n{len(paths)} records ({how}) at {args.imgsz}, medians of "
          f"{args.rounds} alternating rounds; {os.cpu_count()} cores; load average before / after: {before} / {common.load()}; "
          + "; ".join(f"store {s}: the arena is written with {write_mode(s)}" for s in stores) + "\n")  # fmt: skip
    walls = {name: [w for w, _ in rs] for name, rs in got.items()}
    rows = []
    for name, rs in got.items():
        med, cpu = statistics.median(walls[name]), statistics.median(c for _, c in rs)
        rows.append([name, f"{med:.3f}", f"{len(paths) / med:.1f}", f"{statistics.median(walls[loop]) / med:.2f}x",
                     common.paired(walls[loop], walls[name]), f"{cpu:.2f}", f"{1e3 * cpu / len(paths):.3f}",
                     common.runs(walls[name], ".2f")])  # fmt: skip
    header = ["arm", "median s", "img/s", "vs loop", "paired: median (rounds)", "CPU s", "CPU ms / img", "rounds (s)"]
    print(common.table(header, rows))
    return 0


# -- stages -----------------------------------------------------------------------------------------------
def _scratch(store: str, nbytes: int, tag: str) -> tuple[str, int]:
    """A scratch file of ``nbytes`` in the store (a name of its own, no pixpool segment)."""
    path = os.path.join(store, f"bench-prepare-{tag}-{os.getpid()}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.ftruncate(fd, nbytes)
    return path, fd


def _populate(mm: mmap.mmap, offset: int, nbytes: int) -> None:
    """``MADV_POPULATE_WRITE`` of the pages of ``nbytes`` at ``offset`` (what ``ArenaWriter`` does on huge pages)."""
    from pixpool.server.snapshot.arena_pages import MADV_POPULATE_WRITE

    start = offset - offset % mmap.PAGESIZE
    mm.madvise(MADV_POPULATE_WRITE, start, offset + nbytes - start)


def _write_arena(store: str, images: list, dtype: str, how: str) -> None:
    """The arena of ``images`` written into a scratch file, through ``pwrite`` or a mapping."""
    import numpy as np

    from pixpool.server.snapshot.decode import centre

    itemsize = 4 if dtype == "float32" else 1
    sizes = [im.size * itemsize for im in images]
    path, fd = _scratch(store, sum(sizes), "stages")
    try:
        offset = 0
        if how == "mapping":
            mm = mmap.mmap(fd, sum(sizes))
            arena = np.frombuffer(mm, dtype=np.uint8)
            for im, n in zip(images, sizes):
                _populate(mm, offset, n)
                dst = arena[offset : offset + n]
                if itemsize == 1:
                    np.copyto(dst.reshape(im.shape), im)
                else:
                    centre(im, out=dst.view(np.float32).reshape(im.shape))
                offset += n
            del arena, dst
            mm.close()
            return
        band = np.empty(_BAND_NBYTES // 4, dtype=np.float32)
        for im, n in zip(images, sizes):
            if itemsize == 1:
                os.pwrite(fd, im, offset)
            else:
                h, w = im.shape[:2]
                rows = max(1, _BAND_NBYTES // (w * 12))
                for y in range(0, h, rows):
                    part = im[y : y + rows]
                    out = band[: part.size].reshape(part.shape)
                    centre(part, out=out)
                    os.pwrite(fd, out, offset + y * w * 12)
            offset += n
    finally:
        os.close(fd)
        os.unlink(path)


def stages_main(argv: list[str]) -> int:
    """Each step of a preparation alone, CPU ms per image, and the 2-core floor (``stages``)."""
    p = common.parser(stages_main.__doc__, "prepare.py --what stages")
    _data_args(p)
    args = p.parse_args(argv)
    import cv2
    import numpy as np

    from pixpool.server.snapshot import decode
    from pixpool.server.snapshot.arena_pages import huge_page_store, write_mode
    from pixpool.server.snapshot.prepare import header_size_hw

    cv2.setNumThreads(1)
    with tempfile.TemporaryDirectory(prefix="pxbench-prepare-") as folder:
        paths = [r.image_path for r in files(args, folder).records]
        resized = [decode.resize_long_side(decode.decode_bgr(p), args.imgsz) for p in paths]
        decoded = [cv2.imread(p, cv2.IMREAD_COLOR) for p in paths]
        scratch = np.empty(max(im.size for im in resized), dtype=np.float32)  # faulted once, reused
        steps = {
            "header read (Pillow: size, EXIF, end marker)": lambda: [header_size_hw(p) for p in paths],
            "cv2.imread (the loop's decode)": lambda: [cv2.imread(p, cv2.IMREAD_COLOR) for p in paths],
            "decode_bgr (imread + libjpeg warnings caught)": lambda: [decode.decode_bgr(p) for p in paths],
            "resize (INTER_LINEAR, where over imgsz)": lambda: [
                decode.resize_long_side(im, args.imgsz) for im in decoded
            ],
            "centre to float32 (into one reused buffer)": lambda: [
                decode.centre(im, out=scratch[: im.size].reshape(im.shape)) for im in resized
            ],  # fmt: skip
        }
        for dtype in ("uint8", "float32"):
            for how in ("pwrite", "mapping"):
                name = f"write {dtype}{' (centring included)' if dtype == 'float32' else ''}, {how}"
                steps[name] = lambda dtype=dtype, how=how: _write_arena(args.store, resized, dtype, how)

        cpu_ms: dict[str, list[float]] = {name: [] for name in steps}
        before = common.load()
        for _ in range(args.rounds):  # each step over all the files, then the next
            for name, step in steps.items():
                c0 = common.cpu_s()
                step()
                cpu_ms[name].append(1e3 * (common.cpu_s() - c0) / len(paths))
    med = {name: statistics.median(v) for name, v in cpu_ms.items()}
    print(f"`{args.command}`\n\n{len(paths)} images at {args.imgsz}, store {args.store} "
          f"(huge pages: {huge_page_store(args.store)}; preparation writes with {write_mode(args.store)}), CPU ms per "
          f"image, medians of {args.rounds} rounds, one process; load average before / after: {before} / {common.load()}\n")  # fmt: skip
    print(common.table(["step", "CPU ms / img", "rounds"], [[n, f"{v:.3f}", common.runs(cpu_ms[n], ".3f")] for n, v in med.items()]))  # fmt: skip
    loop = med["cv2.imread (the loop's decode)"] + med["resize (INTER_LINEAR, where over imgsz)"]
    base = med["header read (Pillow: size, EXIF, end marker)"] + med["decode_bgr (imread + libjpeg warnings caught)"]
    base += med["resize (INTER_LINEAR, where over imgsz)"]
    print(f"\nthe loop (imread + resize): {loop:.3f} ms per image")
    for name in [n for n in med if n.startswith("write ")]:
        record = base + med[name]
        print(
            f"one record, {name[6:]}: {record:.3f} ms; two decoders on two cores at best {2 * loop / record:.2f}x the loop"
        )
    return 0


# -- writers ----------------------------------------------------------------------------------------------
WRITER_ARMS = (("pwrite", False), ("pwrite", True), ("mapping", False), ("mapping + populate", False))


def _writer(k: int, writers: int, how: str, path: str, records: int, src, per_writer_file: bool) -> None:
    """A forked writer: every ``writers``-th record from ``k`` on (plain os.fork: bytes only, ``os._exit``)."""
    import numpy as np

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
            _populate(mm, off, n)
        arena[off : off + n] = src
    os._exit(0)


def _writers_run(store: str, how: str, per_writer_file: bool, records: int, src, writers: int = 2) -> tuple[float, float, float]:  # fmt: skip
    """(wall, CPU, system CPU) seconds of ``writers`` forked writers."""
    nbytes = src.nbytes * (-(-records // writers) if per_writer_file else records)
    made = [_scratch(store, nbytes, f"writers-{k}") for k in range(writers if per_writer_file else 1)]
    for _, fd in made:
        os.close(fd)
    paths = [made[k if per_writer_file else 0][0] for k in range(writers)]
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
        for path, _ in made:
            os.unlink(path)
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), r1.ru_stime - r0.ru_stime


def writers_main(argv: list[str]) -> int:
    """Two writers into the store, four ways, per record (``writers``)."""
    p = common.parser(writers_main.__doc__, "prepare.py --what writers")
    p.add_argument("--store", default="/dev/shm")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--records", type=int, default=512)
    args = p.parse_args(argv)
    import numpy as np

    before, rows = common.load(), []
    for what, nbytes in (("uint8", 640 * 480 * 3), ("float32", 640 * 480 * 3 * 4)):
        src = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
        got = common.rounds({arm: lambda arm=arm, src=src: _writers_run(args.store, *arm, args.records, src) for arm in WRITER_ARMS}, args.rounds)  # fmt: skip
        for (how, own), v in got.items():
            med = [1e3 * statistics.median(x[i] for x in v) / args.records for i in range(3)]
            rows.append(
                [what, f"{how}, {'a file per writer' if own else 'one shared file'}", *(f"{m:.3f}" for m in med)]
            )
    print(f"`{args.command}`\n\n2 writers, {args.records} records a run, store {args.store}, "
          f"medians of {args.rounds} alternating rounds, per record; load average before / after: {before} / {common.load()}\n")  # fmt: skip
    print(common.table(["record", "how", "wall ms", "CPU ms", "of which system"], rows, left=2))
    return 0


# -- decode warnings ----------------------------------------------------------------------------------------
def decode_warnings_main(argv: list[str]) -> int:
    """What catching libjpeg's warnings costs per decoded image (``decode-warnings``)."""
    p = common.parser(decode_warnings_main.__doc__, "prepare.py --what decode-warnings")
    p.add_argument("--images", type=Path, default=common.COCO128_IMAGES)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    import cv2

    from pixpool.server.snapshot.decoder_warnings import capture_fd2, split_corrupt

    cv2.setNumThreads(1)
    paths = sorted(str(p) for p in args.images.glob("*.jpg"))
    if not paths:
        raise SystemExit(f"no .jpg files in {args.images}; pass --images DIR")

    def decode_all(captured: bool) -> tuple[float, str]:
        h, t0 = hashlib.sha256(), time.perf_counter()
        for path in paths:
            if captured:
                image, text = capture_fd2(lambda path=path: cv2.imread(path, cv2.IMREAD_COLOR))
                split_corrupt(text)
            else:
                image = cv2.imread(path, cv2.IMREAD_COLOR)
            h.update(image)
        return (time.perf_counter() - t0) / len(paths), h.hexdigest()

    before = common.load()
    got = common.rounds(
        {"plain": lambda: decode_all(False), "captured": lambda: decode_all(True)}, args.rounds, warmup=True
    )
    calls, t0 = 20000, time.perf_counter()  # the decode's own variance hides microseconds: the capture around a no-op
    for _ in range(calls):
        split_corrupt(capture_fd2(lambda: None)[1])
    alone_us = 1e6 * (time.perf_counter() - t0) / calls
    ms = {arm: [1e3 * s for s, _ in v] for arm, v in got.items()}
    common.dump({
        "images": len(paths), "rounds": args.rounds, "load": [before, common.load()],
        "ms_per_image": {a: round(statistics.median(v), 3) for a, v in ms.items()},
        "ms_per_image_rounds": {a: [round(x, 3) for x in v] for a, v in ms.items()},
        "capture_us_per_image_paired": round(1e3 * statistics.median(c - p for c, p in zip(ms["captured"], ms["plain"])), 1),
        "capture_alone_us_per_call": round(alone_us, 2),
        "same_bytes": len({d for v in got.values() for _, d in v}) == 1,
    })  # fmt: skip
    return 0


# -- labels ------------------------------------------------------------------------------------------------
def _label_case(name: str, args) -> dict:
    """One case, in this (fresh) interpreter: seconds, peak RSS and the outcome."""
    from pixpool.server.readers import load_dataset
    from pixpool.server.synthetic import write_synthetic
    from pixpool.shared.errors import DatasetError

    if name == "coco128":
        folder = common.COCO128_IMAGES
        load_dataset(folder)  # warm the page cache
        times = []
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            load_dataset(folder)
            times.append(time.perf_counter() - t0)
        return {"case": name, "median_s": round(statistics.median(times), 4), "runs_s": [round(t, 4) for t in times]}
    with tempfile.TemporaryDirectory(prefix="pxbench-labels-") as tmp:
        data = write_synthetic(tmp, num_images=4, seed=0)
        line = "0 0.5 0.5 0.1 0.1\n" * args.lines if name == "runaway" else f"{args.class_id} 0.5 0.5 0.1 0.1\n"
        (data.labels_dir / "synth_0001.txt").write_text(line)
        t0 = time.perf_counter()
        try:
            dataset = load_dataset(data.images_dir)
            outcome = f"read: {len(dataset)} records, {len(dataset.names)} class names"
        except (DatasetError, MemoryError) as exc:  # the refusal is the measurement
            outcome = f"{type(exc).__name__}: {str(exc)[:300]}"
        seconds = time.perf_counter() - t0
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"case": name, "seconds": round(seconds, 3), "peak_rss_mb": round(peak_mb, 1), "outcome": outcome}


def labels_main(argv: list[str]) -> int:
    """What reading YOLO label files costs, refused and accepted, a fresh interpreter per case (``labels``)."""
    p = common.parser(labels_main.__doc__, "prepare.py --what labels")
    p.add_argument("--lines", type=int, default=1_000_000, help="box lines of the runaway label file")
    p.add_argument("--class-id", type=int, default=1_000_000)
    p.add_argument("--rounds", type=int, default=5, help="reads of coco128's labels")
    p.add_argument("--case", choices=("runaway", "class_id", "coco128"), help="one case, in this process")
    args = p.parse_args(argv)
    if args.case:
        print(json.dumps(_label_case(args.case, args)), flush=True)
        return 0
    for case in ("runaway", "class_id", "coco128"):
        argv_case = [sys.executable, str(Path(__file__).resolve()), "--what", "labels", "--case", case, "--lines",
                     str(args.lines), "--class-id", str(args.class_id), "--rounds", str(args.rounds)]  # fmt: skip
        out = subprocess.run(argv_case, capture_output=True, text=True, check=False, env={**os.environ, "PYTHONWARNINGS": "ignore"})  # fmt: skip
        print(out.stdout.strip() or json.dumps({"case": case, "error": out.stderr.strip()[-500:]}))
    return 0


def main(argv: list[str] | None = None) -> int:
    return common.dispatch(
        {
            "speed": (speed_main, "preparation (dtype, processes, store) against the imread + resize loop"),
            "stages": (stages_main, "each step of a preparation alone, and the floor they allow"),
            "writers": (writers_main, "two writers into the store: one file or one each, pwrite or the mapping"),
            "decode-warnings": (decode_warnings_main, "what catching libjpeg's warnings costs per image"),
            "labels": (labels_main, "reading label files: a runaway file, a huge class id, coco128's"),
        },
        argv,
    )


if __name__ == "__main__":
    sys.exit(main())
