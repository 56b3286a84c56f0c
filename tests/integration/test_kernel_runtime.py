"""The fused kernel at run time: a worker's imports stay lean, and the lane width the CPU
picks (SSE2, AVX2 or AVX-512F) never changes a byte.

Integration tests: each runs one short child interpreter, reaped before it returns.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from helpers.daemon import WAIT_S

RENDER = textwrap.dedent("""
    import json, sys
    import pixpool.server.daemon.worker, pixpool.server.snapshot.handle
    from pixpool.server.daemon import renderer
    from pixpool.server.augment import _kernel
    from pixpool.shared.stream.config import AugmentConfig, StreamSettings
    from pixpool.shared.stream.digest import batch_digest
    from pixpool.shared.stream.records import Targets
    from pixpool.shared.task import DETECT
    import numpy as np

    class Source:  # helpers.sources would load OpenCV itself (its centring helper)
        imgsz = 64
        spec = DETECT
        def __init__(self):
            rng = np.random.default_rng(3)
            self.images = [(rng.integers(0, 256, (h, w, 3)) - 114).astype(np.float32) for h, w in [(64, 48), (40, 64), (64, 64), (50, 60)] * 2]
            box = np.array([[0.1, 0.2, 0.6, 0.7], [0.3, 0.1, 0.9, 0.5]], np.float32)
            poly = lambda b: np.array([[b[0], b[1]], [b[2], b[1]], [b[2], b[3]], [b[0], b[3]]], np.float32)
            self.t = Targets(np.array([0, 1], np.int32), box, (poly(box[0]), poly(box[1])))
        def __len__(self):
            return len(self.images)
        def image(self, i):
            return self.images[i]
        def targets(self, i):
            return self.t

    src = Source()
    st = StreamSettings(seed=1, batch_size=4, augment=AugmentConfig(imgsz=64, copy_paste={cp}, mixup=0.5, degrees={deg}))
    out = np.empty((4, 3, 64, 64), np.uint8)
    digests = []
    for b in range(2):
        targets, _counts, samples = renderer.render_range(src, st, 0, b, 0, 4, out)
        digests.append(batch_digest(out, targets))
    print(json.dumps({{"modules": [m for m in ("cv2", "torch", "pycocotools") if m in sys.modules], "lanes": _kernel.simd(), "digests": digests}}))
""")


def _run(cp: float, deg: float, env: dict | None = None) -> dict:
    code = RENDER.format(cp=cp, deg=deg)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=WAIT_S, env=env, check=True
    )
    return json.loads(out.stdout)


def test_a_worker_renders_without_opencv_or_torch() -> None:
    assert _run(0.0, 0.0)["modules"] == []
    # Copy-paste still rasterises its polygons with OpenCV, loaded on first use.
    assert _run(0.5, 0.0)["modules"] == ["cv2"]


def test_every_lane_width_gives_the_same_bytes() -> None:
    """The widest loops the CPU has (what a worker runs) against 4 lanes (PIXPOOL_KERNEL_SSE2)
    and 8 (PIXPOOL_KERNEL_LANES=8, where the CPU picks 16)."""
    narrow = {**os.environ, "PIXPOOL_KERNEL_SSE2": "1"}
    eight = {**os.environ, "PIXPOOL_KERNEL_LANES": "8"}
    for cp, deg in ((0.0, 0.0), (0.5, 12.0)):
        wide, four = _run(cp, deg), _run(cp, deg, narrow)
        assert four["lanes"] == 4
        assert wide["digests"] == four["digests"]
        if wide["lanes"] == 16:
            middle = _run(cp, deg, eight)
            assert middle["lanes"] == 8 and middle["digests"] == wide["digests"]
