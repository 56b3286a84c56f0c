"""bench/vs_ultralytics.py: pixpool against Ultralytics' own loader, on the same images.

Three questions (``--what``), each against Ultralytics' loader as its users run it today
(``build_yolo_dataset`` cache='ram' + ``build_dataloader``), run by another venv's Python
(``--ul-python``, default ``$PIXPOOL_UL_PYTHON`` or /work/venv-ul/bin/python) through
``bench/_ultralytics_arm.py``, which never imports pixpool: Ultralytics is no dependency.

- ``speed`` (default, this file): delivered img/s into a consuming process.
- ``fidelity`` (``bench/_fidelity.py``): is pixpool's stream the same augmentation, statistically.
- ``train`` (``bench/_yolo_train.py``): the same Ultralytics training fed by either loader.
- ``tune`` (``bench/_yolo_tune.py``): N concurrent Ray Tune trials on one daemon against the same
  N trials each with ``cache=ram``: total memory and wall time.

The memory of N trainers against N Ultralytics loaders is ``bench/memory.py``.

Same data for both arms (``_common.make_data_dir``): coco128 (``labels-seg`` for segment),
``pixpool synth --task pose|obb`` (128 images, seed 0) for pose and obb; imgsz 640, batch 16;
the routes of ``_ultralytics_arm.TASK_ROUTES`` (detect: mosaic 1.0, translate 0.1, scale
0.5, fliplr 0.5, HSV 0.015/0.7/0.4, no rotation, shear, perspective, mixup or copy-paste;
segment: the same with copy-paste 0.5, both arms delivering the overlap masks Ultralytics'
segment trainer consumes; pose with the set's flip_idx and obb: the detect settings).

    python -P bench/vs_ultralytics.py --quick --what speed --tasks detect --hsv-device 0
    python bench/vs_ultralytics.py --what fidelity [--task segment] [--quick]
    python bench/vs_ultralytics.py --what train [--epochs 3] [--repeats 5]
    python bench/vs_ultralytics.py --what tune [--trials 3] [--epochs 1] [--pairs 2]
"""

from __future__ import annotations

import contextlib
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
import _ultralytics_arm as ul  # noqa: E402

SPEED_PAIRS = [
    # (label, task, pixpool workers, pixpool HSV on the trainer, Ultralytics workers)
    ("detect, 1 worker vs workers=0", "detect", 1, False, 0),
    ("detect, 2 workers vs 2", "detect", 2, False, 2),
    ("segment + copy-paste 0.5, 1 worker vs workers=0", "segment", 1, False, 0),
    ("segment + copy-paste 0.5, 2 workers vs 2", "segment", 2, False, 2),
    ("pose, 2 workers vs 2", "pose", 2, False, 2),
    ("obb, 2 workers vs 2", "obb", 2, False, 2),
    ("detect, 1 worker, pixpool HSV on the trainer vs workers=0", "detect", 1, True, 0),
    ("detect, 2 workers, pixpool HSV on the trainer vs 2", "detect", 2, True, 2),
]


def touch(batch, task: str) -> None:
    """What a trainer reads first: the image tensor, and for segment the mask planes, which
    must be there (equal work with Ultralytics' segment loader, which renders them); pose and
    obb rows must carry their keypoints / angle, as Ultralytics' batches do."""
    int(batch[0][0, 0, 0, 0])
    width = batch[1].shape[1]
    if task == "segment":
        masks = getattr(batch, "masks", None)
        if masks is None:
            raise RuntimeError("a segment batch came without masks: not equal work with Ultralytics' loader")
        int(masks[0, 0, 0])
    elif (task == "pose" and width <= 6) or (task == "obb" and width != 7):
        raise RuntimeError(f"{task} target rows of {width} columns: this pixpool does not deliver the {task} columns")


def trainer(spec: dict) -> None:
    """A pixpool trainer process (``--trainer SPEC``): one warm-up epoch, then img/s over the
    timed epochs, touching every batch."""
    import torch

    import pixpool.client

    torch.set_num_threads(1)
    task = spec["task"]
    options = {"batch_size": spec["batch"], "seed": 0, "imgsz": spec["imgsz"], "timeout_s": common.WAIT_S}
    with pixpool.client.attach(
        spec["socket_dir"], hsv_on_device=spec["hsv_on_device"], **options, **spec["route"]
    ) as loader:
        for batch in loader:  # warm-up epoch
            touch(batch, task)
        n, t0 = 0, time.perf_counter()
        for _ in range(spec["epochs"]):
            for batch in loader:
                touch(batch, task)
                n += batch[0].shape[0]
        secs = time.perf_counter() - t0
    print(json.dumps({"img_per_s": n / secs, "images": n, "seconds": secs}), flush=True)


def pixpool_speed(data_dir: Path, task: str, route: dict, *, workers: int, hsv_on_device: bool, args) -> float:
    """img/s of one fresh daemon with ``workers`` workers and one fresh trainer process."""
    fields = {
        "data": str(data_dir / "data.yaml"),
        "imgsz": args.imgsz,
        "task": task,
        "keep_snapshot": True,
        "no_val": True,
    }
    with common.daemon(workers=workers, **fields) as (d, _):
        spec = {"socket_dir": d, "task": task, "route": route, "epochs": args.epochs, "batch": args.batch,
                "imgsz": args.imgsz, "hsv_on_device": hsv_on_device}  # fmt: skip
        return common.run_json([sys.executable, str(Path(__file__).resolve()), "--trainer", json.dumps(spec)])[
            "img_per_s"
        ]


def speed(args, dirs: dict[str, Path]) -> list[dict]:
    """Every pair of ``args.tasks``, ``args.pairs`` rounds; the arm that goes first alternates."""
    from pixpool.server.readers import load_dataset

    pairs = [p for p in SPEED_PAIRS if p[1] in args.tasks and (args.hsv_device or not p[3])]
    with_px = "pixpool" in args.arms
    if not with_px:  # Ultralytics' loader alone: one row per task and worker count
        pairs = [p for p in pairs if not p[3]]
    px: dict[int, list[float]] = {i: [] for i in range(len(pairs))}
    ul_runs: dict[tuple[str, int], list[float]] = {}
    loads: dict[int, list[str]] = {i: [] for i in range(len(pairs))}  # the 1-min load as each pair starts
    with contextlib.ExitStack() as stack:
        if with_px:  # each task's snapshot prepared once; every daemon re-attaches it
            for task in {p[1] for p in pairs}:
                data = load_dataset(dirs[task] / "data.yaml", task=task)
                stack.enter_context(common.prepared(data, imgsz=args.imgsz, processes=2, task=task))
        for r in range(args.pairs):
            for i, (label, task, pw, dev, uw) in enumerate(pairs):
                route = {**ul.PIXPOOL_ROUTES[task], **args.geometry}
                loads[i].append(f"{os.getloadavg()[0]:.1f}")
                for arm in common.alternate(("px", "ul"), r + i):
                    if arm == "px" and with_px:
                        px[i].append(pixpool_speed(dirs[task], task, route, workers=pw, hsv_on_device=dev, args=args))
                    elif (
                        arm == "ul" and len(ul_runs.get((task, uw), [])) <= r
                    ):  # HSV-on-trainer pairs reuse the round's
                        got = ul.run(args.ul_python, "throughput", dirs[task], task=task, workers=uw, epochs=args.epochs,
                                     batch=args.batch, imgsz=args.imgsz, geometry=json.dumps(args.geometry))  # fmt: skip
                        ul_runs.setdefault((task, uw), []).append(got["img_per_s"])
                mine = f"{px[i][-1]:.1f}" if with_px else "not run"
                print(f"round {r + 1}/{args.pairs} {label}: pixpool {mine}, ultralytics {ul_runs[(task, uw)][-1]:.1f} img/s",
                      file=sys.stderr, flush=True)  # fmt: skip
    return [
        {"pair": label, "pixpool_runs": px[i], "ultralytics_runs": ul_runs[(task, uw)], "loads": loads[i]}
        for i, (label, task, _, _, uw) in enumerate(pairs)
    ]


def report(args, rows: list[dict], versions: str, loads: tuple[str, str]) -> str:
    out = []
    for r in rows:
        p, u = r["pixpool_runs"], r["ultralytics_runs"]
        load = ", ".join(r["loads"])
        if not p:  # --arms ultralytics
            out.append(
                [r["pair"], "not run", f"{statistics.median(u):.1f}", "", "", "", "", common.runs(u, ".0f"), load]
            )
            continue
        out.append([r["pair"], f"{statistics.median(p):.1f}", f"{statistics.median(u):.1f}", common.headline(p, u)[1],
                    f"{statistics.median(p) / statistics.median(u):.2f}x", common.paired(p, u),
                    common.runs(p, ".0f"), common.runs(u, ".0f"), load])  # fmt: skip
    header = ["pair", "pixpool img/s", "Ultralytics img/s", "headline (median per pair)", "ratio of medians",
              "ratio per pair: median (pairs)", "pixpool runs", "Ultralytics runs", "load at each pair"]  # fmt: skip
    geometry = f", both arms with {', '.join(f'{k} {v:g}' for k, v in args.geometry.items())}" if args.geometry else ""
    return "\n".join(
        [
            f"`{args.command}`",
            "",
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; coco128 (pose, obb: their synthetic sets) at "
            f"{args.imgsz}, batch {args.batch}{geometry}; Ultralytics {versions} in its own venv; delivered img/s into "
            f"a consuming process, {args.pairs} alternating pairs of fresh processes, {args.epochs} timed epochs each "
            f"after a warm-up epoch, HSV on the CPU in both unless said; load average before / after: {loads[0]} / {loads[1]}.",
            "",
            common.table(header, out),
            "",
            "A pair is one round: the two arms ran back to back, so the ratio per pair cancels the load of that moment; "
            "the ratio of medians does not. A headline is the median ratio per pair, written only from at least "
            f"{common.HEADLINE_PAIRS} pairs whose ratios spread at most {common.HEADLINE_SPREAD:.0%} of it "
            "((largest - smallest) / median); quote no other figure as one. "
            "The `HSV on the trainer` rows run torch's HSV on the trainer's CPU here.",
        ]
    )


def speed_main(argv: list[str]) -> int:
    """Delivered img/s into a consuming process: per pair and round one fresh Ultralytics process
    (its loader iterated in that process) and one fresh pixpool daemon (spawned) with one fresh
    trainer process iterating ``pixpool.client.attach``; each imports torch, runs a warm-up
    epoch, then times ``--epochs`` epochs touching every batch (and the masks, for segment).
    Pairs: pixpool 1 worker vs Ultralytics workers=0 and 2 vs 2, HSV on the CPU in both; with
    ``--hsv-device 1`` also pixpool with HSV on the trainer against the same Ultralytics runs."""
    p = common.parser(speed_main.__doc__, "vs_ultralytics.py --what speed")
    p.add_argument("--quick", action="store_true", help="3 pairs of 3 timed epochs (default: 5 pairs of 8)")
    p.add_argument("--tasks", default=",".join(ul.TASKS), help=f"pairs to run, any of {', '.join(ul.TASKS)}")
    p.add_argument("--arms", default="pixpool,ultralytics", help="both (default), or 'ultralytics' alone (no ratio)")
    p.add_argument("--pairs", type=int, default=None, help="alternating pairs (default 5; 3 with --quick)")
    p.add_argument("--epochs", type=int, default=None, help="timed epochs per run (default 8; 3 with --quick)")
    p.add_argument("--hsv-device", type=int, default=1, help="1: also the pairs with pixpool's HSV on the trainer")
    p.add_argument("--geometry", default="", help="degrees, shear, perspective for both arms, e.g. degrees=10,shear=2")
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument(
        "--ul-python", default=common.UL_PYTHON, help="Python of a venv with Ultralytics (env PIXPOOL_UL_PYTHON)"
    )
    p.add_argument("--coco128", type=Path, default=common.COCO128)
    p.add_argument("--json", type=Path, default=None, help="also write the runs here")
    p.add_argument("--write", type=Path, default=None, help="markdown file whose speed block to replace")
    args = p.parse_args(argv)
    args.pairs = args.pairs or (3 if args.quick else 5)
    args.epochs = args.epochs or (3 if args.quick else 8)
    args.tasks = [t for t in args.tasks.split(",") if t]
    args.arms = {a for a in args.arms.split(",") if a}
    if set(args.tasks) - set(ul.TASKS) or "ultralytics" not in args.arms or args.arms - {"pixpool", "ultralytics"}:
        p.error(f"--tasks takes {', '.join(ul.TASKS)}; --arms pixpool,ultralytics or ultralytics")
    geometry = [item.partition("=") for item in args.geometry.split(",") if item]
    if any(key not in ("degrees", "shear", "perspective") for key, _, _ in geometry):
        p.error(f"--geometry {args.geometry!r}: each of degrees, shear, perspective, as NAME=VALUE")
    args.geometry = {key: float(value) for key, _, value in geometry}
    versions = common.ul_version(args.ul_python)
    before = common.load()
    root = Path(tempfile.mkdtemp(prefix="pxbench-ul-"))
    try:
        dirs = {task: common.make_data_dir(root, task, args.coco128) for task in args.tasks}
        rows = speed(args, dirs)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    text = report(args, rows, versions, (before, common.load()))
    print(text)
    if args.json:
        args.json.write_text(json.dumps({"speed": rows, "load": [before, common.load()]}, indent=1))
    if args.write:
        key = "vs-ultralytics" if "detect" in args.tasks else "vs-ultralytics-tasks"
        common.write_section(args.write, key, text, "## Latest run: delivered speed against Ultralytics' loader")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--trainer"]:
        trainer(json.loads(argv[1]))
        return 0
    import _fidelity
    import _yolo_train
    import _yolo_tune

    return common.dispatch(
        {
            "speed": (speed_main, "delivered img/s into a consuming process, per pair (this file)"),
            "fidelity": (_fidelity.main, "the stream's statistics against Ultralytics' own (bench/_fidelity.py)"),
            "train": (_yolo_train.main, "the same Ultralytics training fed by either loader (bench/_yolo_train.py)"),
            "tune": (_yolo_tune.main, "N tuning trials on one daemon against N with cache=ram (bench/_yolo_tune.py)"),
        },
        argv,
    )


if __name__ == "__main__":
    sys.exit(main())
