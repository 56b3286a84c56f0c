"""Preparations against a /dev/shm filled to the page: run as ``python -m helpers.full_store
DATA IMGSZ`` by ``test_store_accounting.py``, under ``unshare -m``, as root.

Mounts a small tmpfs over /dev/shm (in this mount namespace only), learns what the snapshot
of DATA and the preparation's own files made before its capacity check (its worker pool's
semaphores, its shared counters) take there, then prepares with the store filled so that at
the check it holds (1) one page less than the snapshot's pages, (2) exactly its pages while
another file takes the rest midway (``hogging_decoder``), (3) exactly its pages. Each
preparation runs in a fresh process (``attempt``), as a daemon's first one does: what a
process makes once (a progress bar's lock) is made again. Prints one JSON line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

SHM = "/dev/shm"
FILLER = os.path.join(SHM, "filler")
HOG = os.path.join(SHM, "hog")


def _free() -> int:
    st = os.statvfs(SHM)
    return st.f_bavail * st.f_frsize


def _fill_to(free_nbytes: int) -> None:
    """Leave exactly ``free_nbytes`` of /dev/shm free, with a filler file."""
    _unlink(FILLER)
    fd = os.open(FILLER, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.posix_fallocate(fd, 0, _free() - free_nbytes)
    finally:
        os.close(fd)
    if _free() != free_nbytes:
        raise RuntimeError(f"/dev/shm has {_free()} bytes free, wanted {free_nbytes}")


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def attempt(data: str, imgsz: int, decoder: str) -> dict:
    """One preparation in this (fresh) process: what it raised, the free bytes at its capacity
    check, the snapshot's segment sizes, and what it left in /dev/shm."""
    from pixpool.server.readers import load_dataset
    from pixpool.server.snapshot import prepare
    from pixpool.shared.errors import CapacityError

    dataset = load_dataset(data)
    seen = {"before": _free()}
    real_check = prepare.check_capacity

    def probe(total_nbytes, **kw):
        seen["at_check"] = _free()
        return real_check(total_nbytes, **kw)

    prepare.check_capacity = probe
    out = {"error": None, "sizes": None}
    try:
        result = prepare.prepare_snapshot(dataset, prepare.PrepareOptions(imgsz=imgsz, processes=2), decoder=decoder)
    except CapacityError as exc:
        out["error"] = str(exc)
    else:
        out["sizes"] = result.snapshot.nbytes
        result.snapshot.release()
    out.update(seen)
    out["left"] = sorted(n for n in os.listdir(SHM) if n.startswith("pixpool"))
    return out


def _fresh(data: str, imgsz: int, decoder: str = "pixpool.server.snapshot.decode_worker") -> dict:
    r = subprocess.run(
        [sys.executable, "-m", "helpers.full_store", "attempt", data, str(imgsz), decoder],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if r.returncode != 0:
        raise RuntimeError(f"attempt exited {r.returncode}: {r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(data: str, imgsz: int) -> dict:
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", SHM], check=True, timeout=30)
    page = os.sysconf("SC_PAGE_SIZE")
    trial = _fresh(data, imgsz)
    own = trial["before"] - trial["at_check"]  # made before the capacity check
    pages = sum(-(-n // page) * page for n in trial["sizes"].values())
    out = {"bytes": sum(trial["sizes"].values()), "pages": pages, "page": page, "own": own}
    _fill_to(own + pages - page)
    out["one_page_short"] = _fresh(data, imgsz)
    _fill_to(own + pages)
    out["taken_midway"] = _fresh(data, imgsz, "helpers.hogging_decoder")
    out["taken_midway"]["hog"] = os.lstat(HOG).st_blocks * 512
    _unlink(HOG)
    _fill_to(own + pages)
    out["exact"] = _fresh(data, imgsz)
    _unlink(FILLER)
    return out


if __name__ == "__main__":
    if sys.argv[1] == "attempt":
        print(json.dumps(attempt(sys.argv[2], int(sys.argv[3]), sys.argv[4])))
    else:
        print(json.dumps(main(sys.argv[1], int(sys.argv[2]))))
