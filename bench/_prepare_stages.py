"""``bench/prepare.py --stages``: each step of a preparation timed alone, in one process.

Runs in the shell process only (no decode workers). Every step runs over all the files,
then the next step, ``rounds`` times; the figure is the median over rounds of the CPU time
(user + system of this process) per image, which a busy machine inflates less than wall
time. The write steps write a uint8 or float32 arena of the real size into a scratch file
in the store (not a pixpool segment: a name of its own, removed at once), through the
descriptor (``pwrite``, 256 KB bands for float32 as ``ArenaWriter`` does) and through a
mapping (``MADV_POPULATE_WRITE`` per record, then the copy or the centring into it).

From the steps it prints what one decoder pays per record and the floor of two decoders on
two cores: twice the loop's speed needs a record to cost no more CPU than the loop's own
imread + resize, and a float32 record 1.2x needs at most 2 / 1.2 of it.
"""

from __future__ import annotations

import mmap
import os
import resource
import statistics

_BAND_NBYTES = 256 * 1024


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _scratch(store: str, nbytes: int) -> tuple[str, int]:
    path = os.path.join(store, f"bench-prepare-stages-{os.getpid()}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.ftruncate(fd, nbytes)
    return path, fd


def _write_arena(store: str, images: list, dtype: str, how: str) -> None:
    import numpy as np

    from pixpool.server.snapshot import decode
    from pixpool.server.snapshot.arena_pages import MADV_POPULATE_WRITE

    itemsize = 4 if dtype == "float32" else 1
    sizes = [im.size * itemsize for im in images]
    path, fd = _scratch(store, sum(sizes))
    try:
        if how == "mapping":
            mm = mmap.mmap(fd, sum(sizes))
            arena = np.frombuffer(mm, dtype=np.uint8)
            offset = 0
            for im, n in zip(images, sizes):
                start = offset - offset % mmap.PAGESIZE
                mm.madvise(MADV_POPULATE_WRITE, start, offset + n - start)
                dst = arena[offset : offset + n]
                if itemsize == 1:
                    np.copyto(dst.reshape(im.shape), im)
                else:
                    decode.centre(im, out=dst.view(np.float32).reshape(im.shape))
                offset += n
            del arena, dst
            mm.close()
            return
        band = np.empty(_BAND_NBYTES // 4, dtype=np.float32)
        offset = 0
        for im, n in zip(images, sizes):
            if itemsize == 1:
                os.pwrite(fd, im, offset)
            else:
                h, w = im.shape[:2]
                rows = max(1, _BAND_NBYTES // (w * 12))
                for y in range(0, h, rows):
                    part = im[y : y + rows]
                    out = band[: part.size].reshape(part.shape)
                    decode.centre(part, out=out)
                    os.pwrite(fd, out, offset + y * w * 12)
            offset += n
    finally:
        os.close(fd)
        os.unlink(path)


def print_stages(paths: list[str], imgsz: int, store: str, rounds: int) -> None:
    import cv2
    import numpy as np

    from pixpool.server.snapshot import decode
    from pixpool.server.snapshot.arena_pages import huge_page_store, write_mode
    from pixpool.server.snapshot.prepare import header_size_hw

    resized = [decode.resize_long_side(decode.decode_bgr(p), imgsz) for p in paths]
    decoded = [cv2.imread(p, cv2.IMREAD_COLOR) for p in paths]
    scratch = np.empty(max(im.size for im in resized), dtype=np.float32)  # faulted once, reused

    def centre_all() -> None:
        for im in resized:
            decode.centre(im, out=scratch[: im.size].reshape(im.shape))

    steps = {
        "header read (Pillow: size, EXIF, end marker)": lambda: [header_size_hw(p) for p in paths],
        "cv2.imread (the loop's decode)": lambda: [cv2.imread(p, cv2.IMREAD_COLOR) for p in paths],
        "decode_bgr (imread + libjpeg warnings caught)": lambda: [decode.decode_bgr(p) for p in paths],
        "resize (INTER_LINEAR, where over imgsz)": lambda: [decode.resize_long_side(im, imgsz) for im in decoded],
        "centre to float32 (into one reused buffer)": centre_all,
        "write uint8, pwrite": lambda: _write_arena(store, resized, "uint8", "pwrite"),
        "write uint8, mapping": lambda: _write_arena(store, resized, "uint8", "mapping"),
        "write float32 (centring included), pwrite": lambda: _write_arena(store, resized, "float32", "pwrite"),
        "write float32 (centring included), mapping": lambda: _write_arena(store, resized, "float32", "mapping"),
    }
    cpu_ms: dict[str, list[float]] = {name: [] for name in steps}
    load_before = os.getloadavg()
    for _ in range(rounds):
        for name, step in steps.items():
            c0 = _cpu()
            step()
            cpu_ms[name].append(1e3 * (_cpu() - c0) / len(paths))
    load_after = os.getloadavg()
    med = {name: statistics.median(v) for name, v in cpu_ms.items()}
    print(
        f"{len(paths)} images at imgsz {imgsz}, store {store} (huge pages: {huge_page_store(store)}; preparation "
        f"writes with {write_mode(store)}), CPU ms per image, medians of {rounds} rounds, one process; load average "
        f"before {'/'.join(f'{x:.2f}' for x in load_before)}, after {'/'.join(f'{x:.2f}' for x in load_after)}"
    )
    for name, value in med.items():
        print(f"  {name:48s} {value:7.3f}   all: {' '.join(f'{v:.3f}' for v in cpu_ms[name])}")
    loop = med["cv2.imread (the loop's decode)"] + med["resize (INTER_LINEAR, where over imgsz)"]
    base = med["header read (Pillow: size, EXIF, end marker)"] + med["decode_bgr (imread + libjpeg warnings caught)"]
    base += med["resize (INTER_LINEAR, where over imgsz)"]
    print(f"  the loop (imread + resize): {loop:.3f} ms per image")
    for dtype in ("uint8", "float32"):
        for how in ("pwrite", "mapping"):
            record = base + med[f"write {dtype}{' (centring included)' if dtype == 'float32' else ''}, {how}"]
            print(
                f"  one {dtype} record, {how}: {record:.3f} ms; two decoders on two cores at best "
                f"{2 * loop / record:.2f}x the loop (no start-up, no lock waits)"
            )
