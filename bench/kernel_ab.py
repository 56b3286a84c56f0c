"""The render kernel of another commit against this checkout's, on the same recorded calls: bytes and time.

Runs in one process. It builds ``server/augment/_kernel.c`` of ``--base`` (a git ref;
default the commit before issue 19's kernel work) with the compiler and the flags of this
checkout's ``setup.py`` into a temporary folder, imports it beside the installed kernel,
records the route's kernel calls on coco128 at 640 (``render_batch`` over centred float32
arrays and over the raw uint8 ones, ``--batches`` batches of 16 per route setting, HSV on the
CPU and on the device), then:

1. renders every recorded call with both builds and compares the uint8 output and the
   float image byte for byte, and the uint8 output of the call without the float image (the
   route's own call, which may take another path) (exit 1 on a difference);
2. times the two builds on the same calls, alternating (base, this; then this, base) over
   ``--runs`` rounds, CPU time of the process: ms per image of the kernel alone, medians,
   and the ratio this / base paired per round.

    python bench/kernel_ab.py [--base REF] [--base-flags "-O2 ..."] [--runs 7] [--batches 2]
        [--routes axis,rotate,perspective,mix]

``--base-flags`` builds the base with other compiler flags than this checkout's setup.py
(e.g. the earlier ``-O2`` line), so that a change of flags is measured with the code.
``--this REF`` builds the compared kernel from a git ref too (e.g. ``HEAD``), the same way as
the base, instead of using the installed one: the installed build also carries Python's own
compile flags (``-g -fwrapv``, ...), which moved the axis rows, whose code did not change, by
up to 1.15x in issue 19's round 3; built the same way they were 0.97-1.02x.

The machine is shared: the paired ratio is the figure to read; the load average is printed.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import re
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BASE_REF = "c65afef"  # the layout commit: the kernel before issue 19
ROUTES = {
    "axis": {},
    "rotate": {"degrees": 10.0, "shear": 2.0},
    "perspective": {"perspective": 0.0005},
    "mix": {"degrees": 10.0, "shear": 2.0, "mixup": 1.0, "copy_paste": 0.5},
}


def build_kernel(ref: str, where: Path, flags: list[str] | None = None) -> Path:
    """Compile ``_kernel.c`` of commit ``ref`` with ``flags`` (default: setup.py's KERNEL_FLAGS); returns the .so."""
    src = where / "src"
    src.mkdir()
    for name in ("_kernel.c", "_kernel_hsv.h"):
        text = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{ref}:server/augment/{name}"], check=True, capture_output=True
        ).stdout
        (src / name).write_bytes(text)
    if flags is None:
        setup_text = (ROOT / "setup.py").read_text()
        found = re.search(r"KERNEL_FLAGS = (\[.*?\])", setup_text, re.DOTALL)
        if not found:
            raise SystemExit("setup.py has no KERNEL_FLAGS list: cannot build the base kernel with the same flags")
        flags = ast.literal_eval(found.group(1))
    out = where / f"_kernel{sysconfig.get_config_var('EXT_SUFFIX')}"
    cc = os.environ.get("CC", "cc")
    cmd = [
        cc,
        "-shared",
        "-fPIC",
        *flags,
        "-I",
        sysconfig.get_paths()["include"],
        str(src / "_kernel.c"),
        "-o",
        str(out),
    ]
    subprocess.run(cmd, check=True)
    return out


def _load(path: Path, current):
    """Import the extension at ``path`` as a second copy of the kernel; the installed one stays in sys.modules."""
    name = "pixpool.server.augment._kernel"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = current  # single-phase init put the copy there
    return module


def record_calls(routes: list[str], batches: int) -> dict[tuple[str, str, str], list[tuple]]:
    """The kernel calls ``render_batch`` makes, per (route, source dtype, HSV side); nothing is rendered."""
    sys.path.insert(0, str(ROOT / "bench"))
    from augment import DEFAULT_DATA, _Arrays

    from pixpool.server.augment import kernel, render_batch
    from pixpool.server.readers import load_dataset
    from pixpool.server.snapshot.decode import centre, decode_bgr, resize_long_side
    from pixpool.shared.stream.config import AugmentConfig, StreamSettings
    from pixpool.shared.stream.records import Targets

    dataset = load_dataset(str(DEFAULT_DATA), None)
    u8 = [resize_long_side(decode_bgr(r.image_path), 640) for r in dataset.records]
    targets = [Targets.from_record(r) for r in dataset.records]
    floats = [centre(x) for x in u8]
    calls: dict[tuple[str, str, str], list[tuple]] = {}
    real = kernel._kernel
    key = ("", "", "")

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
                    st = StreamSettings(
                        seed=0,
                        batch_size=16,
                        hsv_on_device=side == "device",
                        augment=AugmentConfig(imgsz=640, **ROUTES[route]),
                    )
                    source = _Arrays(images, targets, 640, convert=False)
                    for b in range(batches):
                        render_batch(source, st, 0, b)
    finally:
        kernel._kernel = real
    return calls


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", default=BASE_REF, help="git ref whose kernel to compare")
    p.add_argument("--base-flags", default=None, help="compiler flags for the base build (default: setup.py's)")
    p.add_argument("--this", default=None, help="git ref to build as the compared kernel (default: the installed one)")
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--batches", type=int, default=2, help="batches of 16 per route, dtype and HSV side")
    p.add_argument("--routes", default=",".join(ROUTES), help=f"comma-separated, of {', '.join(ROUTES)}")
    args = p.parse_args(argv)
    routes = [r for r in args.routes.split(",") if r]
    unknown = [r for r in routes if r not in ROUTES]
    if unknown:
        raise SystemExit(f"--routes: unknown {unknown}; choose from {list(ROUTES)}")

    from pixpool.server.augment import _kernel as this

    with tempfile.TemporaryDirectory(prefix="pixpool-kernel-ab-") as tmp:
        base_flags = args.base_flags.split() if args.base_flags else None
        base = _load(build_kernel(args.base, Path(tmp), base_flags), this)
        if args.this:
            (Path(tmp) / "this").mkdir()
            this = _load(build_kernel(args.this, Path(tmp) / "this"), this)
        calls = record_calls(routes, args.batches)
        differ = 0
        for cl in calls.values():
            for a in cl:
                size = a[0]
                outs = [np.zeros((3, size, size), np.uint8) for _ in range(2)]
                fls = [np.zeros((size, size, 3), np.float32) for _ in range(2)]
                base.render(size, outs[0], fls[0], *a[3:])
                this.render(size, outs[1], fls[1], *a[3:])
                alone = [np.zeros((3, size, size), np.uint8) for _ in range(2)]
                base.render(size, alone[0], None, *a[3:])
                this.render(size, alone[1], None, *a[3:])
                differ += (
                    outs[0].tobytes() != outs[1].tobytes()
                    or fls[0].tobytes() != fls[1].tobytes()
                    or alone[0].tobytes() != alone[1].tobytes()
                )
        total = sum(len(c) for c in calls.values())
        load_before = os.getloadavg()
        times: dict[tuple, dict[str, list[float]]] = {k: {"base": [], "this": []} for k in calls}
        for run in range(args.runs):
            for key, cl in calls.items():
                pair = (("base", base), ("this", this))
                for name, mod in pair if run % 2 == 0 else pair[::-1]:
                    c0 = time.process_time()
                    for a in cl:
                        mod.render(*a)
                    times[key][name].append((time.process_time() - c0) / len(cl) * 1e3)
        load_after = os.getloadavg()
    print(
        f"kernel of {args.base} (base{', ' + args.base_flags if args.base_flags else ''}) against "
        f"{args.this + ' (built the same way)' if args.this else 'this checkout (installed)'}, "
        f"{total} recorded calls on coco128 at 640 "
        f"({args.batches} batches of 16 per row), {args.runs} alternating rounds, CPU time; "
        f"load {load_before[0]:.2f} before, {load_after[0]:.2f} after; {differ} calls differ in bytes"
    )
    print("| route | source | HSV | base ms/img | this ms/img | this / base (paired, median) |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for (route, dtype, side), d in times.items():
        ratio = statistics.median(t / b for t, b in zip(d["this"], d["base"], strict=True))
        print(
            f"| {route} | {dtype} | {side} | {statistics.median(d['base']):.2f} | {statistics.median(d['this']):.2f} | {ratio:.2f}x |"
        )
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
