"""bench/store.py: the store: a disk folder against /dev/shm, the in-use lock per attach, the open checks.

Runs in one process (the measurer); daemons run in spawned processes.

- ``disk`` (default): images/s a daemon delivers from a disk store, page cache warm and cold,
  against the same daemon serving from /dev/shm. coco128 listed ``--repeat`` times (duplicates
  are records too, so the snapshot is that many times larger), prepared once in each store
  and kept, so every arm re-attaches it. Arms (a fresh daemon with ``--workers`` workers each,
  one epoch from the first request to the last batch, worker start-up excluded), alternating
  with the order rotated: ``shm``; ``disk-warm`` (every snapshot page read into the page cache
  first); ``disk-cold`` (the files dropped from the page cache first with
  ``POSIX_FADV_DONTNEED``: no process maps them between arms). Each arm reports how much of the
  snapshot was resident when it started (``mincore``).
- ``locks``: what the in-use lock (``shared/transport/holds.py``) costs per attach: a
  synthetic snapshot's three segments attached and closed ``--attaches`` times per round with
  ``SharedSegment.attach`` as pixpool does it, and with its hold step (the lock and the
  name-still-this-file check) replaced by nothing; also the probes that decide, ``holds_of``
  and a refused ``remove_unused``, per segment.
- ``open-checks``: what the store's open checks cost, each against what it replaced (an arm
  that does what the code did before), per call: a segment's checked open (``open_trusted``,
  with ``O_NONBLOCK``), the ``holds_of`` probe (with its ``fstat``), a snapshot's removal unit
  (its label indexes checked by content, before by name prefix), publishing a 64 KiB file
  (``O_TMPFILE`` + ``linkat``, before ``.tmp<pid>`` + rename); in a private store folder.

    python bench/store.py --what disk [--repeat 4] [--rounds 5] [--disk DIR]
    python bench/store.py --what locks [--rounds 15] [--attaches 300]
    python bench/store.py --what open-checks [--rounds 15] [--calls 2000]
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:  # the helpers beside this file, under python -P too
    sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402

from pixpool.shared.transport.store import Store


# -- disk ---------------------------------------------------------------------------------------------
def _repeated_json(src: Path, repeat: int, out: Path) -> Path:
    data = json.loads(src.read_text())
    images, anns = [], []
    for rep in range(repeat):
        images += [{**im, "id": im["id"] + rep * 10**7} for im in data["images"]]
        anns += [
            {**a, "id": a["id"] + rep * 10**8, "image_id": a["image_id"] + rep * 10**7} for a in data["annotations"]
        ]
    out.write_text(json.dumps({**data, "images": images, "annotations": anns}))
    return out


def _advise(paths: list[str], advice: int, read: bool = False) -> None:
    """``posix_fadvise`` of every file; with ``read``, one read pass as well."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, advice)
            while read and os.read(fd, 1 << 24):
                pass
        finally:
            os.close(fd)


def _epoch(config: dict, workers: int, batch_size: int) -> float:
    """img/s of one epoch from a fresh daemon, read by this process."""
    from pixpool.client import Client
    from pixpool.client.options import ClientOptions
    from pixpool.shared.stream.config import AugmentConfig, StreamSettings

    with common.daemon(workers=workers, keep_snapshot=True, **config) as (d, _):
        settings = StreamSettings(seed=0, batch_size=batch_size, augment=AugmentConfig(imgsz=config["imgsz"]))
        with Client.connect(settings, ClientOptions(socket_dir=d, timeout_s=300, as_torch=False)) as client:
            n, t0 = 0, time.perf_counter()
            for b in client.epoch(0):
                int(b.images[0, 0, 0, 0])  # the consumer touches the batch
                n += len(b.samples)
            return n / (time.perf_counter() - t0)


def disk_main(argv: list[str]) -> int:
    """A disk store, page cache warm and cold, against /dev/shm (``disk``)."""
    p = common.parser(disk_main.__doc__, "store.py --what disk")
    p.add_argument("--repeat", type=int, default=4, help="list coco128 this many times")
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--disk", default="/var/tmp", help="parent folder of the disk store (not a tmpfs)")
    args = p.parse_args(argv)
    from pixpool.server.readers import load_dataset
    from pixpool.server.snapshot.prepare import PrepareOptions, prepare_snapshot
    from pixpool.shared.transport.store import fs_type, is_memory, resident_nbytes

    work = Path(tempfile.mkdtemp(prefix="pxbench-store-"))
    disk = os.path.realpath(tempfile.mkdtemp(prefix="pxstore-", dir=args.disk))
    if is_memory(disk):
        shutil.rmtree(disk)
        p.error(f"{disk} is on a {fs_type(disk)}: give --disk a folder on a local disk")
    before, snaps, kept = common.load(), {}, []
    try:
        data = str(_repeated_json(common.COCO128_JSON, args.repeat, work / "instances_rep.json"))
        dataset = load_dataset(data, common.COCO128_IMAGES)
        for store in ("/dev/shm", disk):  # kept, so that every arm's daemon re-attaches it
            prep = prepare_snapshot(
                dataset, PrepareOptions(imgsz=args.imgsz, processes=2, keep_snapshot=True, store=store)
            )
            kept.append(prep.snapshot)
            snaps[store] = [os.path.join(store, n) for n in prep.snapshot.segment_names]
            nbytes = prep.image_bytes + prep.index_bytes + prep.target_bytes
            prep.snapshot.close()

        def arm(store: str, advice: int | None):
            def run():
                if advice is not None:
                    _advise(snaps[disk], advice, read=advice == os.POSIX_FADV_WILLNEED)
                resident = sum(map(resident_nbytes, snaps[store])) / sum(map(os.path.getsize, snaps[store]))
                config = {"data": data, "images": str(common.COCO128_IMAGES), "imgsz": args.imgsz, "store": store}
                return _epoch(config, args.workers, args.batch_size), resident

            return run

        arms = {"shm": arm("/dev/shm", None), "disk-warm": arm(disk, os.POSIX_FADV_WILLNEED), "disk-cold": arm(disk, os.POSIX_FADV_DONTNEED)}  # fmt: skip
        got = common.rounds(arms, args.rounds, rotate=True)
    finally:
        for snap in kept:
            snap.unlink()
        shutil.rmtree(disk, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    rate = {a: [r for r, _ in v] for a, v in got.items()}
    common.dump({
        "command": args.command, "records": len(dataset), "snapshot_bytes": nbytes, "disk_fs": fs_type(args.disk),
        "img_per_s": {a: round(statistics.median(v), 1) for a, v in rate.items()},
        "img_per_s_rounds": {a: [round(x, 1) for x in v] for a, v in rate.items()},
        "vs_shm_paired": {a: common.paired(v, rate["shm"]) for a, v in rate.items()},
        "resident_at_start": {a: round(statistics.median(x for _, x in v), 3) for a, v in got.items()},
        "load": [before, common.load()],
    })  # fmt: skip
    return 0


# -- locks --------------------------------------------------------------------------------------------
def _per_call_us(fn, args: list, store: Store, n: int) -> float:
    """Microseconds per ``fn(arg, store)`` over ``n`` passes of ``args``, per pass."""
    t0 = time.perf_counter()
    for _ in range(n):
        for arg in args:
            fn(arg, store)
    return (time.perf_counter() - t0) / n * 1e6


def locks_main(argv: list[str]) -> int:
    """The in-use lock's cost per snapshot attach, and the probes that decide (``locks``)."""
    p = common.parser(locks_main.__doc__, "store.py --what locks")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--attaches", type=int, default=300, help="snapshot attaches per arm and round")
    p.add_argument("--store", default="/dev/shm")
    args = p.parse_args(argv)
    from pixpool.server.readers import load_dataset
    from pixpool.server.synthetic import write_synthetic
    from pixpool.shared.transport import holds, shm

    def attaches(hold_step: bool) -> float:
        """us per snapshot attach + close, with the hold step or with it replaced by nothing."""
        real = shm._held_or_gone
        if not hold_step:
            shm._held_or_gone = lambda *a, **k: None
        try:
            attach = lambda n, s: shm.SharedSegment.attach(n, store=s).close()  # noqa: E731
            return _per_call_us(attach, names, Store.of(args.store), args.attaches)
        finally:
            shm._held_or_gone = real

    before = common.load()
    with tempfile.TemporaryDirectory(prefix="pxbench-locks-") as tmp:
        dataset = load_dataset(write_synthetic(tmp, num_images=24, seed=0).coco_json)
        with common.prepared(dataset, imgsz=96, processes=1, store=args.store) as prep:
            names = list(prep.snapshot.segment_names)
            arms = {"locked": lambda: attaches(True), "unlocked": lambda: attaches(False)}
            got = common.rounds(arms, args.rounds, warmup=True)
            # Every probe here is refused: this process's own handle holds the snapshot.
            probe_us = _per_call_us(holds.holds_of, names, Store.of(args.store), args.attaches) / len(names)
            refused = _per_call_us(lambda n, s: holds.remove_unused([n], s), names, Store.of(args.store), args.attaches)
    refused_us = refused / len(names)
    med = {a: statistics.median(v) for a, v in got.items()}
    common.dump({
        "command": args.command, "segments_per_attach": len(names), "load": [before, common.load()],
        "us_per_snapshot_attach_close": {a: round(v, 1) for a, v in med.items()},
        "us_per_snapshot_attach_close_rounds": {a: [round(x, 1) for x in v] for a, v in got.items()},
        "lock_us_per_snapshot_paired": round(statistics.median(a - b for a, b in zip(got["locked"], got["unlocked"])), 1),
        "holds_of_us_per_segment": round(probe_us, 2),
        "refused_remove_us_per_segment": round(refused_us, 2),
    })  # fmt: skip
    return 0


# -- open checks ----------------------------------------------------------------------------------------
_PAYLOAD = os.urandom(64 * 1024)
_BASE_KEY = "00112233aabbccdd"


def _old_open(name: str, store: Store) -> None:
    from pixpool.shared.transport.trusted import check_trusted

    fd = os.open(os.path.join(store, name), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        check_trusted(name, os.fstat(fd), store=store)
    finally:
        os.close(fd)


def _new_open(name: str, store: Store) -> None:
    from pixpool.shared.transport.trusted import open_trusted

    os.close(open_trusted(name, store=store))


def _old_holds(name: str, store: Store) -> None:
    from pixpool.shared.transport import holds

    fd = os.open(os.path.join(store, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        holds.Holds(
            in_use=holds._conflicts(fd, *holds._WHOLE),
            creator=holds._conflicts(fd, holds.CREATOR, 1),
            consumer=holds._conflicts(fd, holds.CONSUMER, 1),
        )
    finally:
        os.close(fd)


def _new_holds(name: str, store: Store) -> None:
    from pixpool.shared.transport.holds import holds_of

    holds_of(name, store)


def _old_unit(base: str, store: Store) -> None:
    from pixpool.shared.transport.names import SNAPSHOT_PARTS, parse

    for seg in store.segments():
        if seg.startswith(f"{base}-"):
            parsed = parse(seg)
            _ = parsed is not None and parsed.group == base and parsed.part not in SNAPSHOT_PARTS


def _new_unit(base: str, store: Store) -> None:
    from pixpool.server.snapshot.unit import label_indexes

    label_indexes(base, store)


def _old_publish(name: str, store: Store) -> None:
    final = os.path.join(store, name)
    tmp = f"{final}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, _PAYLOAD)
    finally:
        os.close(fd)
    os.replace(tmp, final)


def _new_publish(name: str, store: Store) -> None:
    from pixpool.shared.transport.publish import publish_bytes

    publish_bytes(name, _PAYLOAD, store)


def _make_store(parent: str) -> tuple[str, str, str, str]:
    """(store, a segment name, the snapshot base, a publish target): a snapshot's three parts
    and one label index that names it, in a fresh folder."""
    from pixpool.server.snapshot import label_index
    from pixpool.shared.transport.names import snapshot_base, snapshot_parts

    store = tempfile.mkdtemp(prefix="pxbench-open-", dir=parent)
    base = snapshot_base(_BASE_KEY)
    for name in snapshot_parts(base).values():
        Path(store, name).write_bytes(b"\0" * 4096)
    body = label_index._pack_body({"fingerprint": _BASE_KEY * 4, "names": ["a"] * 80}, {})
    head = label_index._HEAD.pack(label_index.MAGIC, label_index.INDEX_VERSION, 0, len(body), b"\0" * 32)
    Path(store, f"{base}-lix0badcafe").write_bytes(head + body)
    for path in os.listdir(store):
        os.chmod(os.path.join(store, path), 0o600)
    return store, snapshot_parts(base)["meta"], base, f"{base}-lix12345678"


def open_checks_main(argv: list[str]) -> int:
    """The store's open checks per call, each against what it replaced (``open-checks``)."""
    p = common.parser(open_checks_main.__doc__, "store.py --what open-checks")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--calls", type=int, default=2000, help="calls per arm and round (publish: a tenth)")
    p.add_argument("--parent", default="/dev/shm", help="where the private store folder is made")
    args = p.parse_args(argv)
    folder, segment, base, target = _make_store(args.parent)
    store = Store.of(folder)
    pairs = {
        "open": (_old_open, _new_open, segment),
        "holds": (_old_holds, _new_holds, segment),
        "unit": (_old_unit, _new_unit, base),
        "publish": (_old_publish, _new_publish, target),
    }
    before, out = common.load(), {}
    try:
        for what, (old, new, arg) in pairs.items():
            n = args.calls if what != "publish" else max(1, args.calls // 10)
            arms = {"before": functools.partial(_per_call_us, old, [arg], store, n), "after": functools.partial(_per_call_us, new, [arg], store, n)}  # fmt: skip
            got = common.rounds(arms, args.rounds, warmup=True)
            out[what] = {
                "before_us": round(statistics.median(got["before"]), 2),
                "after_us": round(statistics.median(got["after"]), 2),
                "paired_diff_us": round(statistics.median(a - b for a, b in zip(got["after"], got["before"])), 2),
            }
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    common.dump({"command": args.command, **out, "load": [before, common.load()]})
    return 0


def main(argv: list[str] | None = None) -> int:
    return common.dispatch(
        {
            "disk": (disk_main, "a disk store, page cache warm and cold, against /dev/shm"),
            "locks": (locks_main, "the in-use lock's cost per snapshot attach"),
            "open-checks": (open_checks_main, "the store's open checks per call, each against what it replaced"),
        },
        argv,
    )


if __name__ == "__main__":
    sys.exit(main())
