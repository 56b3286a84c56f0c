"""bench/open_checks.py: what the store's open checks cost (issue 26, fault classes 2, 3 and 5).

Runs in one process, in a private store (a fresh folder in /dev/shm, or under ``--parent DIR``).
Every round runs each pair of arms ``--calls`` times, alternating (the order swaps each
round), and reports per arm the median over rounds of the time per call, and the median of
the paired differences (after - before, same round):
- ``open``: one open of a segment for reading, checked on the descriptor, and its close.
  after: ``shm.open_trusted`` (``O_NONBLOCK`` | ``O_NOFOLLOW``, fstat, type/owner/mode check);
  before: the same open without ``O_NONBLOCK`` (what pixpool did before issue 26). Every
  segment attach (``SharedSegment.attach``: workers, trainers' rings) and index read pays it.
- ``holds``: ``holds.holds_of`` (``ls``/``clean``/re-attach probes). after: the probe also
  fstats, to answer None for what is no regular file; before: open and three lock tests.
- ``unit``: the removal unit of a snapshot with one label index (``Snapshot.release``,
  ``remove_superseded``, ``clean``). after: ``unit.label_indexes``, which opens each candidate
  checked and reads its header and meta; before: the names that start with the snapshot's
  base (a listing only).
- ``publish``: one 64 KiB file published (``publish.publish_bytes``: ``O_TMPFILE`` + ``linkat``,
  a rename when the name exists); before: ``<name>.tmp<pid>`` with ``O_EXCL``, write, rename.

Usage: ``python bench/open_checks.py [--rounds 15] [--calls 2000]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

_BASE_KEY = "00112233aabbccdd"


def _old_open(name: str, store: str) -> None:
    from pixpool.shared.transport.shm import check_trusted

    fd = os.open(os.path.join(store, name), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        check_trusted(name, os.fstat(fd), store=store)
    finally:
        os.close(fd)


def _new_open(name: str, store: str) -> None:
    from pixpool.shared.transport.shm import open_trusted

    os.close(open_trusted(name, store=store))


def _old_holds(name: str, store: str) -> None:
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


def _new_holds(name: str, store: str) -> None:
    from pixpool.shared.transport.holds import holds_of

    holds_of(name, store)


def _old_unit(base: str, store: str) -> None:
    from pixpool.shared.transport.names import SNAPSHOT_PARTS, list_segments, parse

    head = f"{base}-"
    for seg in list_segments(store):
        if seg.startswith(head):
            parsed = parse(seg)
            _ = parsed is not None and parsed.group == base and parsed.part not in SNAPSHOT_PARTS


def _new_unit(base: str, store: str) -> None:
    from pixpool.server.snapshot.unit import label_indexes

    label_indexes(base, store)


_PAYLOAD = os.urandom(64 * 1024)


def _old_publish(name: str, store: str) -> None:
    final = os.path.join(store, name)
    tmp = f"{final}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, _PAYLOAD)
    finally:
        os.close(fd)
    os.replace(tmp, final)


def _new_publish(name: str, store: str) -> None:
    from pixpool.shared.transport.publish import publish_bytes

    publish_bytes(name, _PAYLOAD, store)


def _per_call_us(fn, arg: str, store: str, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn(arg, store)
    return (time.perf_counter() - t0) / n * 1e6


def _make_store(parent: str) -> tuple[str, str, str, str]:
    """(store, a segment name, the snapshot base, a publish target) with a snapshot's three
    parts and one label index that names it."""
    from pixpool.server.snapshot import label_index
    from pixpool.shared.transport.names import snapshot_base, snapshot_parts

    store = tempfile.mkdtemp(prefix="pxbench-open-", dir=parent)
    base = snapshot_base(_BASE_KEY)
    for name in snapshot_parts(base).values():
        with open(os.path.join(store, name), "wb") as f:
            f.write(b"\0" * 4096)
    body = label_index._pack_body({"fingerprint": _BASE_KEY * 4, "names": ["a"] * 80}, {})
    head = label_index._HEAD.pack(label_index.MAGIC, label_index.INDEX_VERSION, 0, len(body), b"\0" * 32)
    with open(os.path.join(store, f"{base}-lix0badcafe"), "wb") as f:
        f.write(head + body)
    for path in os.listdir(store):
        os.chmod(os.path.join(store, path), 0o600)
    return store, snapshot_parts(base)["meta"], base, f"{base}-lix12345678"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=2000, help="calls per arm and round")
    parser.add_argument("--parent", default="/dev/shm", help="where the private store folder is made")
    args = parser.parse_args(argv)
    store, segment, base, target = _make_store(args.parent)
    pairs = {
        "open": (_old_open, _new_open, segment),
        "holds": (_old_holds, _new_holds, segment),
        "unit": (_old_unit, _new_unit, base),
        "publish": (_old_publish, _new_publish, target),
    }
    times: dict[str, dict[str, list[float]]] = {k: {"before": [], "after": []} for k in pairs}
    try:
        for old, new, arg in pairs.values():  # warm-up: imports, page cache, dentries
            _per_call_us(old, arg, store, 50)
            _per_call_us(new, arg, store, 50)
        for r in range(args.rounds):
            for what, (old, new, arg) in pairs.items():
                n = args.calls if what != "publish" else max(1, args.calls // 10)
                order = (("before", old), ("after", new)) if r % 2 == 0 else (("after", new), ("before", old))
                for arm, fn in order:
                    times[what][arm].append(_per_call_us(fn, arg, store, n))
    finally:
        shutil.rmtree(store, ignore_errors=True)
    out = {}
    for what, arms in times.items():
        diffs = [a - b for a, b in zip(arms["after"], arms["before"])]
        out[what] = {
            "before_us": round(statistics.median(arms["before"]), 2),
            "after_us": round(statistics.median(arms["after"]), 2),
            "paired_diff_us": round(statistics.median(diffs), 2),
        }
    out["load_1min"] = os.getloadavg()[0]
    out["rounds"] = args.rounds
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
