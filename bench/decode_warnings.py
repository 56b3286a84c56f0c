"""bench/decode_warnings.py: what catching libjpeg's warnings costs per decoded image.

Runs in one process, one thread. Two arms over the same JPEG files, alternating round by
round (the order rotates): ``plain``, ``cv2.imread`` alone (the decode before the change),
and ``captured``, the same call inside ``decoder_warnings.capture_fd2`` plus the scan of
what was captured (what ``decode.decode_bgr`` does now). Each round decodes every file once
per arm; the figure is the median over rounds of the per-image time, and the difference of
the two arms, paired by round; then the capture alone, around a call that does nothing.
Also checks that both arms give the same bytes.

Usage: ``python bench/decode_warnings.py [--images DIR] [--rounds 5]`` (default: coco128's
training images beside the checkout).
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time
from pathlib import Path

import cv2

from pixpool.server.snapshot.decoder_warnings import capture_fd2, split_corrupt

DEFAULT_IMAGES = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "coco128" / "images" / "train2017"


def _plain(paths: list[str]) -> tuple[float, str]:
    h = hashlib.sha256()
    t0 = time.perf_counter()
    for p in paths:
        h.update(cv2.imread(p, cv2.IMREAD_COLOR))
    return (time.perf_counter() - t0) / len(paths), h.hexdigest()


def _captured(paths: list[str]) -> tuple[float, str]:
    h = hashlib.sha256()
    t0 = time.perf_counter()
    for p in paths:
        image, text = capture_fd2(lambda: cv2.imread(p, cv2.IMREAD_COLOR))  # noqa: B023 (called in this iteration)
        split_corrupt(text)
        h.update(image)
    return (time.perf_counter() - t0) / len(paths), h.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=Path, default=DEFAULT_IMAGES)
    parser.add_argument("--rounds", type=int, default=5)
    opts = parser.parse_args()
    cv2.setNumThreads(1)
    paths = sorted(str(p) for p in opts.images.glob("*.jpg"))
    if not paths:
        raise SystemExit(f"no .jpg files in {opts.images}; pass --images DIR")
    arms = {"plain": _plain, "captured": _captured}
    times: dict[str, list[float]] = {a: [] for a in arms}
    digests = set()
    _plain(paths)  # page cache and OpenCV warm
    for r in range(opts.rounds):
        order = list(arms) if r % 2 == 0 else list(arms)[::-1]
        for arm in order:
            seconds, digest = arms[arm](paths)
            times[arm].append(seconds)
            digests.add(digest)
    diffs = [c - p for c, p in zip(times["captured"], times["plain"])]
    for arm, ts in times.items():
        rounds = ", ".join(f"{1e3 * t:.3f}" for t in ts)
        print(f"{arm:9s} {1e3 * statistics.median(ts):.3f} ms/image (rounds: {rounds})")
    print(
        f"capture costs {1e6 * statistics.median(diffs):.1f} us/image (median of paired rounds), "
        f"{len(paths)} images; same bytes in both arms: {len(digests) == 1}"
    )
    # The decode's own variance hides a few microseconds: the capture around a no-op call.
    calls = 20000
    t0 = time.perf_counter()
    for _ in range(calls):
        split_corrupt(capture_fd2(lambda: None)[1])
    print(f"the capture alone: {1e6 * (time.perf_counter() - t0) / calls:.2f} us per call ({calls} calls)")


if __name__ == "__main__":
    main()
