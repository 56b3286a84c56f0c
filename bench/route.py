"""bench/route.py: what the route costs per image: its stages, its kernel, its Python, and a delivered image's CPU.

Four questions (``--what``), all on coco128 at 640 with the detect route unless told:

- ``image`` (default): the route in one process, one OpenCV thread (``cv2.setNumThreads(1)``,
  so img/s is per core), arms alternating over ``--runs`` runs, medians: ``fused, float32``
  (centred float32 images: a prepared snapshot with ``--shm``, else the same arrays in
  memory), ``fused, uint8`` (the raw uint8 pixels a uint8 snapshot holds; the kernel converts
  per tap, same bytes), ``fused, HSV on device`` (the workers skip HSV), ``uint8 cache`` (a
  cache that converts and centres per call, what a loader without the prepared snapshot
  does), the route of ``--base`` on the float32 arrays (with HSV on the CPU and on the
  device), and a floor (one float32 ``warpAffine`` per image). Per-stage ms come from each
  route's own stage clock (``timings``): ``source`` (fetch + draws), ``labels``,
  ``copy_paste``, ``kernel`` (every pixel: resample, paste, mixup, fill, quantise, flips, HSV).
- ``kernel``: the render kernel of ``--base`` (built with this checkout's ``setup.py`` flags,
  or ``--base-flags``) against this checkout's source (or ``--this REF``) built the same way,
  each loaded as a copy of the extension, on the same recorded calls of four routes: every call
  compared byte for byte (exit 1 on a difference), then timed alternating, CPU time of the
  kernel alone, the ratio paired per round. Both arms are loaded copies because the installed
  module measured 1.03-1.10x slower than a loaded copy of the very same build (2026-12-03:
  where each lands in memory), more than most changes this compares. ``--lanes 8,16`` compares
  instead one build at two lane widths (the first the base), as ``_kernel.set_lanes`` picks them.
- ``cpu``: where a delivered image's CPU goes, process by process: a fresh interpreter per run
  prepares (or re-attaches) the snapshot (``--dtype``; else the package's default, uint8 since
  it became the default: name it when ``--base`` predates that), starts a daemon with ``--workers`` workers and
  reads it as a trainer (``attach``, batch 16, HSV on the CPU); per delivered image the CPU ms of
  the daemon and each worker (psutil) and of the trainer (getrusage, its threads included), the
  workers' busy fraction, and the gap between batches at an epoch boundary against within one.
  With ``--base`` the base's code and this checkout's alternate, pair by pair.
- ``python``: the route's Python alone (``render_range`` with the kernel call a no-op), the
  base's against this checkout's in one process, alternating rounds; ``--ranges 2`` renders each
  batch as two ranges, as two workers do (a range's work done once is shared by fewer samples).

A base is a git ref (its sides extracted with ``git archive``, its kernel built as above) or a
checkout folder (its sides symlinked; its kernel must be built in it), imported as a second
package (``image``, ``python``) or put first on ``PYTHONPATH`` as ``pixpool`` (``cpu``).

    python bench/route.py --what image [--runs 5] [--batches 2] [--degrees 10 --shear 2] [--base REF]
    python bench/route.py --what kernel --base REF [--this HEAD] [--runs 7] [--routes axis,rotate]
    python bench/route.py --what kernel --lanes 8,16 [--runs 7]
    python -P bench/route.py --what cpu [--base REF|DIR] [--pairs 5]
    python -P bench/route.py --what python --base REF|DIR [--rounds 15] [--ranges 2]
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import importlib.util
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:  # the helpers beside this file, under python -P too
    sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402

STAGES = ["source", "labels", "copy_paste", "mixup", "kernel", "canvas", "warp", "quantise", "hsv", "pack"]
# The routes of ``--what kernel``: one per kernel path, and a mix of them.
KERNEL_ROUTES = {
    "axis": {},
    "rotate": {"degrees": 10.0, "shear": 2.0},
    "perspective": {"perspective": 0.0005},
    "mix": {"degrees": 10.0, "shear": 2.0, "mixup": 1.0, "copy_paste": 0.5},
}
SIDES = ("server", "client", "shared", "ops", "cli", "integrations")


# -- the base: another commit's or checkout's code ------------------------------------------------
def build_kernel(src: Path, out_dir: Path, flags: list[str] | None = None) -> Path:
    """Compile ``src/_kernel.c`` with ``flags`` (default: this checkout's setup.py KERNEL_FLAGS) into ``out_dir``."""
    if flags is None:
        found = re.search(r"KERNEL_FLAGS = (\[.*?\])", (common.ROOT / "setup.py").read_text(), re.DOTALL)
        if not found:
            raise SystemExit("setup.py has no KERNEL_FLAGS list: cannot build a kernel with its flags")
        flags = ast.literal_eval(found.group(1))
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"_kernel{sysconfig.get_config_var('EXT_SUFFIX')}"
    include = sysconfig.get_paths()["include"]
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-shared", "-fPIC", *flags, "-I", include, str(src / "_kernel.c"), "-o", str(out)], check=True)
    return out


def git_tree(ref: str, into: Path, paths: list[str]) -> Path:
    """``paths`` of commit ``ref`` extracted into ``into`` (``git archive``); returns ``into``."""
    into.mkdir(parents=True, exist_ok=True)
    data = subprocess.run(["git", "-C", str(common.ROOT), "archive", ref, *paths], check=True, capture_output=True)
    tar_path = into / "tree.tar"
    tar_path.write_bytes(data.stdout)
    with tarfile.open(tar_path) as tar:
        tar.extractall(into, filter="data")
    tar_path.unlink()
    return into


def base_package(base: str, into: Path, name: str) -> Path:
    """The code of ``base`` (a checkout folder or a git ref) as a regular package ``name`` under
    ``into``; returns ``into`` (the folder to put on ``sys.path`` / ``PYTHONPATH``)."""
    root = into / name
    if Path(base).is_dir():
        root.mkdir(parents=True)
        for side in SIDES:
            if (Path(base) / side).is_dir():
                (root / side).symlink_to(Path(base).resolve() / side)
    else:
        listed = subprocess.run(["git", "-C", str(common.ROOT), "ls-tree", "--name-only", base], check=True,
                                capture_output=True, text=True).stdout.split()  # fmt: skip
        git_tree(base, root, [s for s in SIDES if s in listed])
        if (root / "server" / "augment" / "_kernel.c").exists():
            build_kernel(root / "server" / "augment", root / "server" / "augment")
    (root / "__init__.py").write_text("")
    return into


# -- data -------------------------------------------------------------------------------------------
class Arrays:
    """An ``ImageSource`` over in-memory arrays; ``convert`` centres a uint8 cache on every call."""

    def __init__(self, images, targets, imgsz: int, convert: bool = False):
        from pixpool.shared.task import DETECT

        self._images, self._targets, self.imgsz, self._convert = images, targets, imgsz, convert
        self.spec = DETECT  # coco128's boxes

    def __len__(self) -> int:
        return len(self._images)

    def image(self, index: int):
        from pixpool.server.snapshot.decode import centre

        return centre(self._images[index]) if self._convert else self._images[index]

    def targets(self, index: int):
        return self._targets[index]


def decoded(data: str, images: str | None, imgsz: int):
    """(dataset, uint8 images resized as a snapshot holds them, centred float32 ones, targets), read-only."""
    from pixpool.server.readers import load_dataset
    from pixpool.server.snapshot.decode import centre, decode_bgr, resize_long_side
    from pixpool.shared.stream.records import Targets

    dataset = load_dataset(data, images)
    u8 = [resize_long_side(decode_bgr(r.image_path), imgsz) for r in dataset.records]
    floats = [centre(x) for x in u8]
    for a in (*u8, *floats):
        a.flags.writeable = False
    return dataset, u8, floats, [Targets.from_record(r) for r in dataset.records]


def config_of(package: str):
    """The module of ``StreamSettings`` in ``package``: ``shared.stream.config``, or ``shared.config`` in older code."""
    try:
        return importlib.import_module(f"{package}.shared.stream.config")
    except ModuleNotFoundError:
        return importlib.import_module(f"{package}.shared.config")


def stream(config, imgsz: int, route: dict, *, hsv_on_device: bool = False):
    """The stream settings of batch 16, seed 0, with ``config``'s classes (this pixpool's or a base's);
    only the route's non-zero settings are passed, which older code may not have as fields."""
    augment = config.AugmentConfig(imgsz=imgsz, **{k: v for k, v in route.items() if v})
    return config.StreamSettings(seed=0, batch_size=16, hsv_on_device=hsv_on_device, augment=augment)


# -- image -------------------------------------------------------------------------------------------
def _time_arm(source, st, batches: int, epoch: int, render) -> tuple[float, int, dict[str, float]]:
    """(CPU seconds, images, stage seconds with the wall total as ``_wall``) of ``batches`` batches."""
    import numpy as np

    timings: dict[str, float] = {}
    images = 0
    # Touched before the clock starts: a ring slot is reused memory, so first-touch page
    # faults are no part of the route's cost.
    out = np.zeros((st.batch_size, 3, st.augment.imgsz, st.augment.imgsz), np.uint8)
    out.fill(1)
    # CPU time of this process: the machine is shared, and wall time counts the intervals
    # another process held the core (the stage clock is wall time; see the table).
    c0, t0 = time.process_time(), time.perf_counter()
    for b in range(batches):
        images += len(render(source, st, epoch, b, images_out=out, timings=timings).samples)
    timings["_wall"] = time.perf_counter() - t0
    return time.process_time() - c0, images, timings


def _floor(floats, imgsz: int, count: int) -> float:
    """Wall seconds per image of one float32 ``warpAffine`` to imgsz x imgsz."""
    import cv2
    import numpy as np

    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    for k in range(count):
        a = rng.uniform(0.5, 1.5)
        m = np.array([[a, 0, rng.uniform(-50, 50)], [0, a, rng.uniform(-50, 50)]])
        cv2.warpAffine(floats[k % len(floats)], m, (imgsz, imgsz), flags=cv2.INTER_LINEAR, borderValue=(0, 0, 0))
    return (time.perf_counter() - t0) / count


def image_main(argv: list[str]) -> int:
    """The route per image per core, by stage, arm against arm (module docstring, ``image``)."""
    p = common.parser(image_main.__doc__, "route.py --what image")
    p.add_argument("--data", default=str(common.COCO128_JSON))
    p.add_argument("--images", default=None)
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--runs", type=int, default=5, help="alternating runs")
    p.add_argument("--batches", type=int, default=2, help="batches of 16 per arm per run")
    for name, help_ in (("copy-paste", ""), ("mixup", ""), ("degrees", "the general map"), ("shear", "the general map"), ("perspective", "")):  # fmt: skip
        p.add_argument(f"--{name}", type=float, default=0.0, help=help_ or None)
    p.add_argument(
        "--base", default="none", help="a git ref or checkout whose route to time too (bd80f8a: the OpenCV route)"
    )
    p.add_argument("--shm", action="store_true", help="the float32 arms read a prepared snapshot in /dev/shm")
    args = p.parse_args(argv)
    import cv2

    from pixpool.server.augment import render_batch
    from pixpool.shared.stream import config
    from pixpool.shared.stream.sampler import num_batches

    cv2.setNumThreads(1)
    dataset, u8, floats, targets = decoded(args.data, args.images, args.imgsz)
    geometry = {k: getattr(args, k) for k in ("copy_paste", "mixup", "degrees", "shear", "perspective")}
    st, dev = (stream(config, args.imgsz, geometry, hsv_on_device=d) for d in (False, True))
    batches = min(args.batches, num_batches(len(dataset), st, 0))
    before = common.load()
    with contextlib.ExitStack() as stack:
        source = Arrays(floats, targets, args.imgsz)
        if args.shm:
            prepared = common.prepared(dataset, imgsz=args.imgsz, processes=1, dtype="float32")
            source = stack.enter_context(prepared).snapshot
        arms = {
            "fused, float32": (source, st, render_batch),
            "fused, uint8": (Arrays(u8, targets, args.imgsz), st, render_batch),
            "fused, HSV on device": (source, dev, render_batch),
        }
        if args.base != "none":
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="pxbench-base-")))
            sys.path.insert(0, str(base_package(args.base, tmp, "pixbase")))
            old = importlib.import_module("pixbase.server.augment.batch").render_batch
            base_config = config_of("pixbase")  # its own settings classes
            for label, d in (("", False), (", HSV on device", True)):
                arms[f"route of {args.base[:12]}{label}"] = (source, stream(base_config, args.imgsz, geometry, hsv_on_device=d), old)  # fmt: skip
        arms["uint8 cache (fused route)"] = (Arrays(u8, targets, args.imgsz, convert=True), st, render_batch)
        for src, settings, render in arms.values():  # warm-up: page in, first-call allocations
            _time_arm(src, settings, 1, 99, render)
        results: dict[str, list] = {name: [] for name in arms}
        floor = []
        for run in range(args.runs):
            for name in common.alternate(arms, run):
                results[name].append(_time_arm(*arms[name][:2], batches, run, arms[name][2]))
            floor.append(_floor(floats, args.imgsz, 16 * batches))
    route = ", ".join(f"{k.replace('_', '-')} {v:g}" for k, v in geometry.items() if v)
    stages = [s for s in STAGES if any(tm.get(s, 0.0) > 0 for rs in results.values() for _, _, tm in rs)]
    rows = []
    for name, rs in results.items():
        rate = statistics.median(n / t for t, n, _ in rs)
        wall = statistics.median(tm["_wall"] / n for _, n, tm in rs) * 1e3
        stage = [statistics.median(tm.get(s, 0.0) / n * 1e3 for _, n, tm in rs) for s in stages]
        rows.append(
            [name, f"{rate:.1f}", f"{1e3 / rate:.2f}", f"{wall:.2f}", *(f"{x:.2f}" if x else "" for x in stage)]
        )
    rows.append(
        ["floor: one float32 warpAffine (wall)", "", "", f"{statistics.median(floor) * 1e3:.2f}", *[""] * len(stages)]
    )
    header = ["arm", "img/s per core (CPU)", "ms/img (CPU)", "ms/img (wall)", *stages]
    rate = {name: [n / t for t, n, _ in rs] for name, rs in results.items()}
    pairs = [("fused, float32", "fused, uint8"), ("fused, float32", "uint8 cache (fused route)")]
    pairs += [(a, b) for a, b in (("fused, float32", f"route of {args.base[:12]}"),
                                  ("fused, HSV on device", f"route of {args.base[:12]}, HSV on device")) if b in rate]  # fmt: skip
    print(f"`{args.command}`\n")
    print(f"{Path(args.data).name} at {args.imgsz} (mosaic 1.0{', ' if route else ''}{route}), batch 16, "
          f"{batches} batches per arm per run, {args.runs} alternating runs, one process, one thread; medians; "
          f"totals in CPU time, stages in wall time; load average before / after: {before} / {common.load()}\n")  # fmt: skip
    print(common.table(header, rows))
    print("\nThroughput paired per run: " + "; ".join(f"{a} / {b} {common.paired(rate[a], rate[b])}" for a, b in pairs))
    return 0


# -- kernel ------------------------------------------------------------------------------------------
def _load_kernel(path: Path, installed):
    """The extension at ``path`` as a second copy of the kernel; the installed one stays in sys.modules."""
    name = "pixpool.server.augment._kernel"
    module = importlib.util.module_from_spec(importlib.util.spec_from_file_location(name, path))
    module.__spec__.loader.exec_module(module)
    sys.modules[name] = installed  # single-phase init put the copy there
    return module


class _AtLanes:
    """A kernel module that runs each call at ``lanes`` lanes (``set_lanes`` first: two arms share one build)."""

    def __init__(self, module, lanes: int):
        self.module, self.lanes = module, lanes

    def render(self, *args):
        self.module.set_lanes(self.lanes)
        return self.module.render(*args)


def _lane_widths(p: argparse.ArgumentParser, text: str | None) -> tuple[int, int] | None:
    """``--lanes A,B`` as two widths the kernel knows, or None."""
    if text is None:
        return None
    try:
        a, b = (int(w) for w in text.split(","))
    except ValueError:
        p.error(f"--lanes: two widths such as 8,16, got {text!r}")
    if not {a, b} <= {4, 8, 16}:
        p.error(f"--lanes: widths are 4, 8 or 16, got {text!r}")
    return a, b


def record_calls(routes: list[str], batches: int) -> dict[tuple[str, str, str], list[tuple]]:
    """The kernel calls ``render_batch`` makes per (route, source dtype, HSV side); nothing is rendered."""
    from pixpool.server.augment import kernel, render_batch
    from pixpool.shared.stream import config

    _, u8, floats, targets = decoded(str(common.COCO128_JSON), None, 640)
    calls: dict[tuple[str, str, str], list[tuple]] = {}
    real, key = kernel._kernel, ("", "", "")

    class _Recorder:
        @staticmethod
        def render(*args):
            calls.setdefault(key, []).append(args)

    kernel._kernel = _Recorder
    try:
        for route in routes:
            for dtype, images in (("float32", floats), ("uint8", u8)):
                for side in ("cpu", "device"):
                    key = (route, dtype, side)
                    st = stream(config, 640, KERNEL_ROUTES[route], hsv_on_device=side == "device")
                    for b in range(batches):
                        render_batch(Arrays(images, targets, 640), st, 0, b)
    finally:
        kernel._kernel = real
    return calls


def _differ(base, this, call: tuple) -> tuple[bool, object]:
    """Whether the two builds give other bytes for ``call`` (the image, the float image, and the
    image of the call without the float image: the route's own call, which may take another
    path), and that last image's difference, this - base, per byte (int16)."""
    import numpy as np

    size = call[0]
    outs, fls = [np.zeros((3, size, size), np.uint8) for _ in range(4)], [np.zeros((size, size, 3), np.float32) for _ in range(2)]  # fmt: skip
    for k, mod in enumerate((base, this)):
        mod.render(size, outs[k], fls[k], *call[3:])
        mod.render(size, outs[2 + k], None, *call[3:])
    differ = any(a.tobytes() != b.tobytes() for a, b in ((outs[0], outs[1]), (fls[0], fls[1]), (outs[2], outs[3])))
    return differ, outs[3].astype(np.int16) - outs[2].astype(np.int16)


def _difference_rows(calls: dict, base, this) -> tuple[int, list[list[str]]]:
    """(calls that differ in bytes, per (route, source, HSV) row: the route's image of this
    build against the base's, per byte: max |d|, mean |d|, mean d, share of bytes that differ)."""
    differ, rows = 0, []
    for key, cl in calls.items():
        n = changed = 0
        total_abs = total = 0.0
        worst = 0
        for call in cl:
            d_call, d = _differ(base, this, call)
            differ += d_call
            a = abs(d)
            n, changed = n + d.size, changed + int((a > 0).sum())
            total_abs, total, worst = total_abs + float(a.sum()), total + float(d.sum()), max(worst, int(a.max()))
        rows.append([*key, str(worst), f"{total_abs / n:.4f}", f"{total / n:+.4f}", f"{changed / n:.2%}"])
    return differ, rows


def kernel_main(argv: list[str]) -> int:
    """The kernel of another commit against this checkout's, or one build at two lane widths, on the same recorded calls (``kernel``)."""
    p = common.parser(kernel_main.__doc__, "route.py --what kernel")
    p.add_argument("--base", default=None, help="git ref whose kernel to compare")
    p.add_argument(
        "--lanes", default=None, help="A,B: this build at A lanes (the base) against B lanes (4, 8, 16), no --base"
    )
    p.add_argument("--base-flags", default=None, help="compiler flags for the base build (default: setup.py's)")
    p.add_argument(
        "--this", default=None, help="git ref to build as the compared kernel (default: this checkout's source)"
    )
    p.add_argument("--runs", type=int, default=7, help="alternating rounds")
    p.add_argument("--batches", type=int, default=2, help="batches of 16 per route, dtype and HSV side")
    p.add_argument("--routes", default=",".join(KERNEL_ROUTES), help=f"of {', '.join(KERNEL_ROUTES)}")
    p.add_argument(
        "--other-bytes",
        action="store_true",
        help="the two kernels are meant to differ (a redefined arithmetic): report the difference, exit 0",
    )
    args = p.parse_args(argv)
    routes = [r for r in args.routes.split(",") if r]
    if set(routes) - set(KERNEL_ROUTES):
        p.error(f"--routes: choose from {', '.join(KERNEL_ROUTES)}")
    if (args.base is None) == (args.lanes is None):
        p.error("name one of --base REF and --lanes A,B")
    if args.lanes and args.base_flags:
        p.error("--base-flags builds the --base kernel; --lanes compares one build")
    widths = _lane_widths(p, args.lanes)
    from pixpool.server.augment import _kernel as installed

    with tempfile.TemporaryDirectory(prefix="pxbench-kernel-") as tmp:
        builds = {}
        arms = (
            (("base", args.base, args.base_flags), ("this", args.this, None))
            if widths is None
            else (("this", args.this, None),)
        )
        for arm, ref, flags in arms:
            if ref is None:  # the working tree's source, uncommitted changes included
                src = common.ROOT / "server" / "augment"
            else:
                src = git_tree(ref, Path(tmp) / arm, ["server/augment"]) / "server" / "augment"
            builds[arm] = _load_kernel(
                build_kernel(src, Path(tmp) / f"{arm}-build", flags and flags.split()), installed
            )
        if widths is not None:
            for width in widths:
                try:
                    builds["this"].set_lanes(width)
                except ValueError as e:  # a width this CPU lacks
                    p.error(f"--lanes: {e}")
            builds = {"base": _AtLanes(builds["this"], widths[0]), "this": _AtLanes(builds["this"], widths[1])}
        calls = record_calls(routes, args.batches)
        differ, diff_rows = _difference_rows(calls, builds["base"], builds["this"])
        for build in builds.values():  # warm-up: the recorded calls' output pages touched outside either clock
            for cl in calls.values():
                for call in cl:
                    build.render(*call)
        before = common.load()
        times = {k: {"base": [], "this": []} for k in calls}
        for run in range(args.runs):
            for key, cl in calls.items():
                for arm in common.alternate(("base", "this"), run):
                    c0 = time.process_time()
                    for call in cl:
                        builds[arm].render(*call)
                    times[key][arm].append((time.process_time() - c0) / len(cl) * 1e3)
    compared = (
        f"kernel of {args.base} ({args.base_flags or 'setup.py flags'}) against {args.this or 'this checkout'} "
        "(built the same way)"
        if widths is None
        else f"kernel of {args.this or 'this checkout'} at {widths[0]} lanes (base) against {widths[1]} lanes"
    )
    print(f"{compared}, "
          f"{sum(map(len, calls.values()))} recorded calls on coco128 at 640 ({args.batches} batches of 16 per row), "
          f"{args.runs} alternating rounds, CPU ms per image of the kernel alone; load average before / after: "
          f"{before} / {common.load()}; {differ} calls differ in bytes\n")  # fmt: skip
    rows = [[*key, f"{statistics.median(d['base']):.2f}", f"{statistics.median(d['this']):.2f}",
             common.paired(d["this"], d["base"])] for key, d in times.items()]  # fmt: skip
    print(common.table(["route", "source", "HSV", "base ms/img", "this ms/img", "this / base, paired"], rows, left=3))
    if differ:
        print("\nthe route's image (uint8 out, no float image), this against base, per byte:\n")
        print(
            common.table(
                ["route", "source", "HSV", "max |d|", "mean |d|", "mean d", "bytes that differ"], diff_rows, left=3
            )
        )
    return 1 if differ and not args.other_bytes else 0


# -- cpu ---------------------------------------------------------------------------------------------
def measure(workers: int, epochs: int, dtype: str | None = None) -> dict:
    """One run of ``--what cpu`` in this process (``--run``): the figures of the module docstring."""
    import _ultralytics_arm as ul
    import psutil
    import torch

    import pixpool.client
    from pixpool.server.readers import load_dataset

    root = Path(tempfile.mkdtemp(prefix="pxbench-cpu-"))
    data = common.make_data_dir(root) / "data.yaml"
    fields = {"data": str(data), "imgsz": 640, "keep_snapshot": True, "no_val": True}
    pinned = {"dtype": dtype} if dtype else {}  # else the package's own default
    fields.update(pinned)
    try:
        with (
            common.prepared(load_dataset(data), imgsz=640, processes=2, **pinned),
            common.daemon(workers=workers, **fields) as (d, _),
        ):
            torch.set_num_threads(1)
            st = common.status(d)
            procs = {"daemon": psutil.Process(st.daemon.pid)}
            procs.update({f"worker{i}": psutil.Process(w.pid) for i, w in enumerate(st.workers)})

            def cpu() -> dict[str, float]:
                return {"trainer": common.cpu_s(), **{k: sum(p.cpu_times()[:2]) for k, p in procs.items()}}

            with pixpool.client.attach(d, batch_size=16, seed=0, imgsz=640, timeout_s=300, **ul.PIXPOOL_ROUTES["detect"]) as loader:  # fmt: skip
                for batch in loader:  # warm-up epoch
                    int(batch[0][0, 0, 0, 0])
                c0, busy0, t0 = cpu(), [w.busy_s for w in common.status(d).workers], time.perf_counter()
                images, stamps = 0, []
                for _ in range(epochs):
                    for batch in loader:
                        int(batch[0][0, 0, 0, 0])
                        images += batch[0].shape[0]
                        stamps.append((batch.batch, time.perf_counter()))
                wall = time.perf_counter() - t0
                c1, busy1 = cpu(), [w.busy_s for w in common.status(d).workers]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ms = {k: (c1[k] - c0[k]) / images * 1e3 for k in c0}
    gaps = [(stamps[i][0], stamps[i][1] - stamps[i - 1][1]) for i in range(1, len(stamps))]
    return {
        "img_per_s": images / wall,
        "load": os.getloadavg()[0],
        "ms_per_img": ms,
        "workers_ms_per_img": sum(v for k, v in ms.items() if k.startswith("worker")),
        "total_ms_per_img": sum(ms.values()),
        "busy_fraction": min((b1 - b0) / wall for b0, b1 in zip(busy0, busy1)),
        "gap_ms_within_epoch": statistics.median([g for b, g in gaps if b != 0]) * 1e3,
        "gap_ms_at_epoch_start": statistics.median([g for b, g in gaps if b == 0] or [0.0]) * 1e3,
    }


def cpu_main(argv: list[str]) -> int:
    """CPU ms per delivered image, process by process, optionally base against this (``cpu``)."""
    p = common.parser(cpu_main.__doc__, "route.py --what cpu")
    p.add_argument("--base", default=None, help="a git ref or checkout folder, run in alternating pairs")
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3, help="timed epochs per run, after a warm-up epoch")
    p.add_argument("--dtype", default=None, help="the snapshot's dtype (default: each arm's package default)")
    p.add_argument("--run", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.run:
        print(json.dumps(measure(args.workers, args.epochs, args.dtype)), flush=True)
        return 0
    before = common.load()
    with tempfile.TemporaryDirectory(prefix="pxbench-cpu-root-") as tmp:
        roots: dict[str, Path | None] = {"this": None}  # the installed pixpool
        if args.base:  # both arms' code first on PYTHONPATH, made the same way
            roots = {name: base_package(code, Path(tmp) / name, "pixpool") for name, code in (("base", args.base), ("this", str(common.ROOT)))}  # fmt: skip
        argv_run = [sys.executable, "-P", str(Path(__file__).resolve()), "--what", "cpu", "--run",
                    "--workers", str(args.workers), "--epochs", str(args.epochs),
                    *(["--dtype", args.dtype] if args.dtype else [])]  # fmt: skip

        def arm(name: str):
            env = {**os.environ, **({"PYTHONPATH": str(roots[name])} if roots[name] else {})}
            return lambda: common.run_json(argv_run, env=env, timeout_s=1800)

        got = common.rounds({name: arm(name) for name in roots}, args.pairs)
    report = {"workers": args.workers, "epochs": args.epochs, "pairs": args.pairs, "dtype": args.dtype or "default",
              "load": [before, common.load()]}  # fmt: skip
    for name, rs in got.items():
        report[name] = {
            key: round(statistics.median(r[key] for r in rs), 3)
            for key in (
                "img_per_s",
                "workers_ms_per_img",
                "total_ms_per_img",
                "busy_fraction",
                "gap_ms_within_epoch",
                "gap_ms_at_epoch_start",
            )  # fmt: skip
        }
        report[name]["ms_per_img"] = {
            k: round(statistics.median(r["ms_per_img"][k] for r in rs), 3) for k in rs[0]["ms_per_img"]
        }
        report[name]["runs"] = rs
    if "base" in got:
        this, base = got["this"], got["base"]
        report["this_over_base_paired"] = {
            key: common.paired([r[key] for r in this], [r[key] for r in base])
            for key in ("img_per_s", "total_ms_per_img", "workers_ms_per_img")
        }
        report["this_over_base_paired"]["trainer_ms_per_img"] = common.paired(
            [r["ms_per_img"]["trainer"] for r in this], [r["ms_per_img"]["trainer"] for r in base]
        )
    common.dump(report)
    return 0


# -- python ------------------------------------------------------------------------------------------
def python_main(argv: list[str]) -> int:
    """The route's Python per image, the kernel a no-op, base against this in one process (``python``)."""
    p = common.parser(python_main.__doc__, "route.py --what python")
    p.add_argument("--base", required=True, help="a git ref or checkout folder")
    p.add_argument("--rounds", type=int, default=15, help="alternating rounds of 4 batches of 16")
    p.add_argument(
        "--ranges", type=int, default=1, help="each batch rendered as this many ranges (2: what 2 workers render)"
    )
    args = p.parse_args(argv)
    import numpy as np

    from pixpool.server.readers import load_dataset

    with tempfile.TemporaryDirectory(prefix="pxbench-python-") as tmp:
        sys.path.insert(0, str(base_package(args.base, Path(tmp), "pixbase")))
        arms = {}
        for arm, pkg in (("base", "pixbase"), ("this", "pixpool")):
            batch = importlib.import_module(f"{pkg}.server.augment.batch")
            importlib.import_module(f"{pkg}.server.augment.kernel")._kernel.render = lambda *a: None
            arms[arm] = (batch, stream(config_of(pkg), 640, {}))
        data = common.make_data_dir(Path(tmp) / "data") / "data.yaml"
        out = np.empty((16, 3, 640, 640), np.uint8)
        with common.prepared(load_dataset(data), imgsz=640, processes=2) as prep:

            def run(arm: str):
                batch, settings = arms[arm]
                c0 = time.process_time()
                cuts = [16 * k // args.ranges for k in range(args.ranges + 1)]
                for b in range(4):
                    for lo, hi in zip(cuts[:-1], cuts[1:]):
                        batch.render_range(prep.snapshot, settings, 0, b, lo, hi, images_out=out[lo:hi])
                return (time.process_time() - c0) / 64 * 1e3

            before = common.load()
            ms = common.rounds({arm: lambda arm=arm: run(arm) for arm in arms}, args.rounds, warmup=True)
    common.dump({
        "command": args.command, "rounds": args.rounds, "ranges": args.ranges, "load": [before, common.load()],
        "python_ms_per_img": {a: round(statistics.median(v), 3) for a, v in ms.items()},
        "python_ms_per_img_rounds": {a: [round(x, 3) for x in v] for a, v in ms.items()},
        "this_over_base_paired": common.paired(ms["this"], ms["base"]),
    })  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    return common.dispatch(
        {
            "image": (image_main, "the route per image per core, by stage, arm against arm"),
            "kernel": (kernel_main, "another commit's kernel against this one's: bytes, then time"),
            "cpu": (cpu_main, "CPU per delivered image, process by process (daemon, workers, trainer)"),
            "python": (python_main, "the route's Python alone, base against this"),
        },
        argv,
    )


if __name__ == "__main__":
    sys.exit(main())
