"""bench/vs_ultralytics.py: pixpool against Ultralytics' own loader, side by side, on coco128.

Runs in pixpool's venv (the measurer and pixpool's trainers); the Ultralytics arm runs in
another venv's Python (``--ul-python``, default ``$PIXPOOL_UL_PYTHON`` or
/work/venv-ul/bin/python) as ``bench/_ultralytics_arm.py``, which never imports pixpool.
Ultralytics is no dependency of pixpool.

Same images and labels for both: a temporary YOLO dataset (``data.yaml``, ``images/`` and
``labels/`` as symlinks into ../shared/data/coco128; ``labels-seg`` for the segment task;
for pose and obb, which coco128 lacks, ``pixpool synth --task pose|obb`` with 128 images,
seed 0), imgsz 640, batch 16. Route settings, detect: mosaic 1.0, translate 0.1, scale
0.5, fliplr 0.5, HSV 0.015/0.7/0.4, degrees = shear = perspective = 0, mixup 0, copy-paste 0;
segment: the same with copy-paste 0.5, both arms delivering the masks Ultralytics' segment
trainer consumes (overlap planes at mask_ratio 4); pose (with the set's flip_idx) and obb:
the detect settings (``_ultralytics_arm.TASK_ROUTES``). Equal work: each consumer touches the
images and, for segment, the mask planes of every batch; a pixpool trainer of the segment
task that receives no masks is an error, not a faster run.

Delivered img/s into a consuming process (``--what speed``): each round is one fresh
Ultralytics process (``build_yolo_dataset`` cache='ram' + ``build_dataloader``, iterated
in that process) and one fresh pixpool daemon with W workers (a spawned process) plus one
fresh trainer process iterating ``pixpool.client.attach(...)``; arms alternate, rounds
repeat ``--pairs`` times, figures are medians. Each consumer imports torch, runs one
warm-up epoch, then times ``--epochs`` epochs, touching every batch's image tensor. Pairs:
pixpool 1 worker vs Ultralytics workers=0, pixpool 2 vs Ultralytics 2, HSV on the CPU in
both; then pixpool with ``hsv_on_device=True`` (the trainer applies HSV in torch; on this
machine the "device" is the trainer's CPU) against the same Ultralytics runs.

Memory (``--what memory``): total PSS (``/proc/PID/smaps_rollup``) of N trainers and one
pixpool daemon with ``--mem-workers`` workers (``pixpool.ops.memory_report.memory_report``:
each segment once, whole), against N Ultralytics loaders, each a process with its own
cache='ram' dataset and ``--mem-workers`` workers (PSS of each process and its worker
children). Every consumer has taken two batches and holds its loader. For the float32
snapshot and, when this pixpool has ``--dtype``, the uint8 one (otherwise that arm is
skipped and says so).

``--geometry degrees=10,shear=2[,perspective=0.0005]`` sets the general-affine hyper-parameters
of both arms for the speed pairs (issue 19: the rotated route).

``--tasks segment,pose,obb`` (issue 18) runs those tasks' speed pairs only (segment 1 vs 0 and
2 vs 2, pose and obb 2 vs 2); with ``--what speed`` and no detect, ``--write`` fills the
per-task section. ``--arms ultralytics`` measures Ultralytics' loader alone (no ratio).

Usage: ``python bench/vs_ultralytics.py [--quick] [--what speed,memory] [--dtype float32,uint8]
[--pairs 3] [--epochs 4] [--geometry degrees=10,shear=2] [--tasks detect,segment,pose,obb]
[--arms pixpool,ultralytics] [--write docs/benchmarks.md]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
COCO128_DIR = HERE.parents[1] / "shared" / "data" / "coco128"
UL_ARM = HERE / "_ultralytics_arm.py"
DEFAULT_UL_PYTHON = os.environ.get("PIXPOOL_UL_PYTHON", "/work/venv-ul/bin/python")
WAIT_S = 300.0
MIB = 1 << 20

# The route settings both arms run, defined once in the Ultralytics arm (which imports only
# numpy at module level); pixpool's AugmentConfig has the same names, less the cutmix it
# lacks (0 there).
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _ultralytics_arm  # noqa: E402

DETECT = {k: v for k, v in _ultralytics_arm.DETECT.items() if k != "cutmix"}
SEGMENT = {**DETECT, "copy_paste": 0.5}
TASKS = _ultralytics_arm.TASKS
# Per task, the route of both arms (pixpool's attach options; cutmix is 0 in all, as above).
ROUTES = {task: {k: v for k, v in r.items() if k != "cutmix"} for task, r in _ultralytics_arm.TASK_ROUTES.items()}
SYNTH_IMAGES = 128  # the pose and obb sets: as many images as coco128


# -- the shared dataset ---------------------------------------------------------------------
def make_data_dir(root: Path, task: str, coco128: Path = COCO128_DIR) -> Path:
    """A YOLO dataset folder over coco128 (symlinks), with its data.yaml; returns the folder.

    pose and obb: pixpool's synthetic set of that task (coco128 has neither), written here."""
    if task in ("pose", "obb"):
        from pixpool.server.synthetic import write_synthetic

        return write_synthetic(root / task, num_images=SYNTH_IMAGES, seed=0, task=task).root
    labels = coco128 / ("labels-seg" if task == "segment" else "labels") / "train2017"
    images = coco128 / "images" / "train2017"
    if not images.is_dir() or not labels.is_dir():
        raise SystemExit(
            f"coco128 not found at {coco128} (need images/train2017 and {labels.parent.name}/train2017): it lives in ../shared/data beside the checkout"
        )
    d = root / task
    (d / "images").mkdir(parents=True, exist_ok=True)
    (d / "labels").mkdir(parents=True, exist_ok=True)
    for link, target in ((d / "images" / "train2017", images), (d / "labels" / "train2017", labels)):
        if not link.exists():
            link.symlink_to(target, target_is_directory=True)
    cats = json.loads((coco128 / "annotations" / "instances_train2017.json").read_text())["categories"]
    names = [c["name"] for c in sorted(cats, key=lambda c: c["id"])]
    (d / "data.yaml").write_text(yaml.safe_dump({"path": ".", "train": "images/train2017", "names": names}))
    return d


# -- the Ultralytics arm (another venv) -----------------------------------------------------
def ul_run(ul_python: str, cmd: str, data_dir: Path, **options) -> dict:
    """Run ``_ultralytics_arm.py CMD`` and return its JSON; its log goes to a file shown on failure."""
    argv = [ul_python, str(UL_ARM), cmd, "--data-dir", str(data_dir)]
    for k, v in options.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    proc = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=WAIT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"Ultralytics arm failed ({' '.join(argv)}), exit {proc.returncode}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check_ul_python(ul_python: str) -> str:
    """Ultralytics' version in that Python, or exit saying how to get one."""
    try:
        out = subprocess.run(
            [ul_python, "-c", "import ultralytics, torch; print(ultralytics.__version__, torch.__version__)"],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
    except FileNotFoundError:
        out = None
    if out is None or out.returncode != 0:
        raise SystemExit(
            f"{ul_python} cannot import ultralytics: make a venv with `pip install torch==2.14.1 torchvision==0.29.1 ultralytics` and pass --ul-python VENV/bin/python"
        )
    return out.stdout.strip()


# -- the pixpool arm --------------------------------------------------------------------------
def dtype_field() -> str | None:
    """The ``DaemonConfig`` field behind ``--dtype`` (the snapshot's dtype), or None where this pixpool has none."""
    from pixpool.shared.stream.config import DaemonConfig

    for f in dataclasses.fields(DaemonConfig):
        if f.name == "dtype" or f.metadata.get("flag") == "--dtype":
            return f.name
    return None


def prepare(data_yaml: Path, imgsz: int, task: str = "detect"):
    """Prepare (or re-attach) the float32 snapshot the speed arms' daemons attach; the caller
    releases it. (Memory arms let their one daemon prepare its own, so that a uint8 snapshot
    is prepared exactly as ``serve --dtype uint8`` does, and removed when it exits.)"""
    from pixpool.server.readers import load_dataset
    from pixpool.server.snapshot.prepare import PrepareOptions, prepare_snapshot

    options = {"task": task} if task != "detect" else {}  # detect: the call of every earlier run
    return prepare_snapshot(
        load_dataset(str(data_yaml), **_reader_task(task)), PrepareOptions(imgsz=imgsz, processes=2, **options)
    )


def _reader_task(task: str) -> dict:
    """``load_dataset``'s task keyword where this pixpool's reader takes one (after issue 18's merge)."""
    import inspect

    from pixpool.server.readers import load_dataset

    return {"task": task} if task != "detect" and "task" in inspect.signature(load_dataset).parameters else {}


def release(prep) -> None:
    if not prep.reused:
        prep.snapshot.unlink()
    prep.snapshot.close()


def start_daemon(
    data_yaml: Path, imgsz: int, workers: int, dtype: str, *, keep_snapshot: bool = True, task: str = "detect"
) -> tuple[mp.Process, str]:
    from pixpool.server.daemon.run import run_daemon
    from pixpool.shared.stream.config import DaemonConfig

    d = tempfile.mkdtemp(prefix="pxul-")
    field = dtype_field()
    if field is None and dtype != "float32":
        raise SystemExit(f"this pixpool has no --dtype: a {dtype} snapshot cannot be served")
    extra = {field: dtype} if field else {}
    if task != "detect":
        extra["task"] = task
    config = DaemonConfig(
        data=str(data_yaml),
        imgsz=imgsz,
        workers=workers,
        socket_dir=d,
        keep_snapshot=keep_snapshot,
        no_val=True,
        **extra,
    )
    proc = mp.get_context("spawn").Process(target=run_daemon, args=(config,))
    proc.start()
    return proc, d


def wait_ready(socket_dir: str, workers: int, proc: mp.Process) -> None:
    from pixpool.ops.status_client import query_status
    from pixpool.shared.errors import DaemonTimeout

    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if not proc.is_alive():
            raise RuntimeError(f"the daemon exited with {proc.exitcode} before it was ready")
        try:
            st = query_status(socket_dir, timeout_s=1.0)
            if len(st["workers"]) == workers and all(w["pid"] for w in st["workers"]):
                return
        except DaemonTimeout:
            pass
        time.sleep(0.2)  # polling interval of a bounded wait
    raise TimeoutError(f"daemon in {socket_dir} not ready within {WAIT_S} s")


def stop_daemon(proc: mp.Process, socket_dir: str) -> None:
    from pixpool.server.daemon.run import stop_process

    stop_process(proc, timeout_s=60.0)
    shutil.rmtree(socket_dir, ignore_errors=True)


def trainer_argv(
    socket_dir: str,
    mode: str,
    route: dict,
    *,
    epochs: int,
    batch: int,
    imgsz: int,
    hsv_on_device: bool,
    seed: int = 0,
    task: str = "detect",
) -> list[str]:
    spec = {
        "task": task,
        "socket_dir": socket_dir,
        "mode": mode,
        "route": route,
        "epochs": epochs,
        "batch": batch,
        "imgsz": imgsz,
        "hsv_on_device": hsv_on_device,
        "seed": seed,
    }
    return [sys.executable, str(Path(__file__).resolve()), "--trainer", json.dumps(spec)]


def _touch(batch, task: str) -> None:
    """What a trainer reads first: the image tensor, and for segment the mask planes, which
    must be there (equal work with Ultralytics' segment loader, which renders them); pose and
    obb rows must carry their keypoints / angle, as Ultralytics' batches do."""
    int(batch[0][0, 0, 0, 0])
    width = batch[1].shape[1]
    if task == "segment":
        masks = getattr(batch, "masks", None)
        if masks is None:
            raise RuntimeError("a segment batch came without masks: this pixpool does not render them (issue 18)")
        int(masks[0, 0, 0])
    elif (task == "pose" and width <= 6) or (task == "obb" and width != 7):
        raise RuntimeError(f"{task} target rows of {width} columns: this pixpool does not deliver the {task} columns")


def run_trainer(spec: dict) -> None:
    """A pixpool trainer process (``--trainer SPEC``): speed, or hold for a memory reading."""
    import torch

    import pixpool.client

    torch.set_num_threads(1)
    with pixpool.client.attach(
        spec["socket_dir"],
        batch_size=spec["batch"],
        seed=spec["seed"],
        imgsz=spec["imgsz"],
        hsv_on_device=spec["hsv_on_device"],
        timeout_s=WAIT_S,
        **spec["route"],
    ) as loader:
        if spec["mode"] == "hold":
            it = iter(loader)
            for _ in range(2):
                int(next(it)[0][0, 0, 0, 0])
            time.sleep(1.0)  # let the workers fill this trainer's ring before the reading
            print(json.dumps({"pid": os.getpid()}), flush=True)
            sys.stdin.readline()
            it.close()
            return
        task = spec.get("task", "detect")
        for batch in loader:  # warm-up epoch
            _touch(batch, task)
        n = 0
        t0 = time.perf_counter()
        for _ in range(spec["epochs"]):
            for batch in loader:
                _touch(batch, task)
                n += batch[0].shape[0]
        secs = time.perf_counter() - t0
    print(json.dumps({"arm": "pixpool", "images": n, "seconds": secs, "img_per_s": n / secs}), flush=True)


def pixpool_speed(
    data_yaml: Path,
    route: dict,
    *,
    workers: int,
    hsv_on_device: bool,
    epochs: int,
    batch: int,
    imgsz: int,
    dtype: str,
    task: str = "detect",
) -> dict:
    proc, d = start_daemon(data_yaml, imgsz, workers, dtype, task=task)
    try:
        wait_ready(d, workers, proc)
        out = subprocess.run(
            trainer_argv(
                d, "speed", route, epochs=epochs, batch=batch, imgsz=imgsz, hsv_on_device=hsv_on_device, task=task
            ),
            check=False,
            capture_output=True,
            text=True,
            timeout=WAIT_S,
        )
        if out.returncode != 0:
            raise RuntimeError(f"pixpool trainer failed, exit {out.returncode}:\n{out.stderr[-3000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        stop_daemon(proc, d)


# -- speed ----------------------------------------------------------------------------------------
SPEED_PAIRS = [
    # (label, task, pixpool workers, hsv_on_device, Ultralytics workers)
    ("detect, 1 worker vs workers=0", "detect", 1, False, 0),
    ("detect, 2 workers vs 2", "detect", 2, False, 2),
    ("segment + copy-paste 0.5, 1 worker vs workers=0", "segment", 1, False, 0),
    ("segment + copy-paste 0.5, 2 workers vs 2", "segment", 2, False, 2),
    ("pose, 2 workers vs 2", "pose", 2, False, 2),
    ("obb, 2 workers vs 2", "obb", 2, False, 2),
    ("detect, 1 worker, pixpool HSV on the trainer vs workers=0", "detect", 1, True, 0),
    ("detect, 2 workers, pixpool HSV on the trainer vs 2", "detect", 2, True, 2),
]


def speed(args, dirs: dict, ul_python: str) -> list[dict]:
    px: dict[int, list[float]] = {}
    ul: dict[tuple[str, int], list[float]] = {}
    pairs = SPEED_PAIRS if args.hsv_device else [p for p in SPEED_PAIRS if not p[3]]
    if args.tasks:
        pairs = [p for p in pairs if p[1] in args.tasks]
    with_px = "pixpool" in args.arms
    if not with_px:  # the Ultralytics arm alone: one row per task and worker count
        pairs = [p for p in pairs if not p[3]]
    tasks = sorted({p[1] for p in pairs}) if with_px else []
    preps = {task: prepare(dirs[task] / "data.yaml", args.imgsz, task) for task in tasks}
    try:
        for r in range(args.pairs):
            for i, (label, task, pw, dev, uw) in enumerate(pairs):
                route = {**ROUTES[task], **args.geometry}
                # Alternate which arm goes first, round by round.
                arms = ["ul", "px"] if (r + i) % 2 else ["px", "ul"]
                for arm in arms:
                    if arm == "px" and not with_px:
                        continue
                    if arm == "px":
                        res = pixpool_speed(
                            dirs[task] / "data.yaml",
                            route,
                            workers=pw,
                            hsv_on_device=dev,
                            epochs=args.epochs,
                            batch=args.batch,
                            imgsz=args.imgsz,
                            dtype="float32",
                            task=task,
                        )
                        px.setdefault(i, []).append(res["img_per_s"])
                    elif not (
                        dev and len(ul.get((task, uw), [])) > r
                    ):  # the device-HSV pairs reuse this round's Ultralytics runs
                        res = ul_run(
                            ul_python,
                            "throughput",
                            dirs[task],
                            task=task,
                            workers=uw,
                            epochs=args.epochs,
                            batch=args.batch,
                            imgsz=args.imgsz,
                            geometry=json.dumps(args.geometry),
                        )
                        ul.setdefault((task, uw), []).append(res["img_per_s"])
                mine = f"{px[i][-1]:.1f} img/s" if with_px else "not run"
                print(
                    f"round {r + 1}/{args.pairs} {label}: pixpool {mine}, ultralytics {ul[(task, uw)][-1]:.1f} img/s",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        for prep in preps.values():
            release(prep)
    rows = []
    for i, (label, task, _pw, _dev, uw) in enumerate(pairs):
        p, u = px.get(i, []), ul[(task, uw)]
        rows.append(
            {
                "pair": label,
                "pixpool_img_per_s": statistics.median(p) if p else None,
                "ultralytics_img_per_s": statistics.median(u),
                "ratio": statistics.median(p) / statistics.median(u) if p else None,
                "pixpool_runs": p,
                "ultralytics_runs": u,
            }
        )
    return rows


# -- memory ---------------------------------------------------------------------------------------
def _rollup(pid: int) -> dict[str, int]:
    from pixpool.shared.transport.procmem import parse_rollup

    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return parse_rollup(f.read())
    except (FileNotFoundError, ProcessLookupError):
        return {}


def _tree(pid: int) -> list[int]:
    """A process and all its descendants (an Ultralytics loader and its workers)."""
    import psutil

    return [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]


def _file_pss(pids) -> int:
    """The file-backed part of the PSS of ``pids`` (shared libraries, mostly).

    Library pages are shared with every process on the machine that maps the same files,
    so this part depends on who else runs (here: other users of the Ultralytics venv); the
    anonymous and shmem parts do not."""
    return sum(_rollup(p).get("Pss_File", 0) for p in pids)


def _start_holders(argvs: list[list[str]]) -> list[subprocess.Popen]:
    procs = [
        subprocess.Popen(a, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        for a in argvs
    ]
    for p in procs:
        line = p.stdout.readline()  # {"pid": ...} once it holds two batches
        if not line:
            raise RuntimeError(
                f"a measured process exited with {p.wait(WAIT_S)} before it was ready: {' '.join(p.args[:4])} ..."
            )
    return procs


def _stop_holders(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        try:
            p.stdin.write("stop\n")
            p.stdin.flush()
        except BrokenPipeError:
            pass
    for p in procs:
        try:
            p.wait(WAIT_S)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def memory(args, dirs: dict, ul_python: str, dtypes: list[str]) -> list[dict]:
    from pixpool.ops.memory_report import memory_report
    from pixpool.ops.status_client import query_status

    data_yaml = dirs["detect"] / "data.yaml"
    rows = []
    for dtype in dtypes:
        proc, d = start_daemon(data_yaml, args.imgsz, args.mem_workers, dtype, keep_snapshot=False)
        try:
            wait_ready(d, args.mem_workers, proc)
            for n in args.trainers:
                holders = _start_holders(
                    [
                        trainer_argv(
                            d, "hold", DETECT, epochs=1, batch=args.batch, imgsz=args.imgsz, hsv_on_device=False, seed=s
                        )
                        for s in range(n)
                    ]
                )
                try:
                    st = query_status(d)
                    rep = memory_report(st)
                    pids = [
                        st["daemon"]["pid"],
                        *(w["pid"] for w in st["workers"] if w["pid"]),
                        *(h.pid for h in holders),
                    ]
                    file_pss = _file_pss(pids)
                finally:
                    _stop_holders(holders)
                rows.append(
                    {
                        "dtype": dtype,
                        "trainers": n,
                        "pixpool_total": rep["total_pss_bytes"],
                        "pixpool_service": rep["service_pss_bytes"],
                        "pixpool_trainers": rep["trainers_pss_bytes"],
                        "pixpool_no_files": rep["total_pss_bytes"] - file_pss,
                        "snapshot_bytes": rep["snapshot_bytes"],
                    }
                )
        finally:
            stop_daemon(proc, d)
    ul_total, ul_no_files = {}, {}
    for n in args.trainers:
        argv = [
            ul_python,
            str(UL_ARM),
            "hold",
            "--data-dir",
            str(dirs["detect"]),
            "--workers",
            str(args.mem_workers),
            "--batch",
            str(args.batch),
            "--imgsz",
            str(args.imgsz),
        ]
        holders = _start_holders([argv] * n)
        try:
            pids = [q for h in holders for q in _tree(h.pid)]
            ul_total[n] = sum(_rollup(q).get("Pss", 0) for q in pids)
            ul_no_files[n] = ul_total[n] - _file_pss(pids)
        finally:
            _stop_holders(holders)
    for row in rows:
        row["ultralytics_total"] = ul_total[row["trainers"]]
        row["ratio"] = row["pixpool_total"] / row["ultralytics_total"]
        row["ultralytics_no_files"] = ul_no_files[row["trainers"]]
        row["ratio_no_files"] = row["pixpool_no_files"] / row["ultralytics_no_files"]
    return rows


# -- report -----------------------------------------------------------------------------------
def report(args, speed_rows, mem_rows, skipped: list[str], versions: str, load: tuple[str, str]) -> str:
    lines = [
        f"`python bench/vs_ultralytics.py {' '.join(args.argv)}`".replace(" `", "`"),
        "",
        (
            f"coco128 at {args.imgsz}, batch {args.batch}; Ultralytics {versions.split()[0]} (torch {versions.split()[1]}) in its own venv; "
            f"load average before / after: {load[0]} / {load[1]} (2 cores, shared)."
        ),
    ]
    if speed_rows:
        lines += [
            "",
            (
                f"Delivered img/s into a consuming process: medians of {args.pairs} alternating pairs of fresh processes, {args.epochs} timed epochs each "
                "after one warm-up epoch. HSV on the CPU in both unless said."
            ),
            "",
            "| pair | pixpool img/s | Ultralytics img/s | ratio of medians | ratio per pair (median) | pixpool runs | Ultralytics runs |",
            "| --- | ---: | ---: | ---: | ---: | --- | --- |",
        ]
        for r in speed_rows:
            if r["ratio"] is None:  # --arms ultralytics: its loader alone
                lines.append(
                    f"| {r['pair']} | not run | {r['ultralytics_img_per_s']:.1f} | | | | "
                    f"{', '.join(f'{v:.0f}' for v in r['ultralytics_runs'])} |"
                )
                continue
            paired = [a / b for a, b in zip(r["pixpool_runs"], r["ultralytics_runs"], strict=True)]
            lines.append(
                f"| {r['pair']} | {r['pixpool_img_per_s']:.1f} | {r['ultralytics_img_per_s']:.1f} | **{r['ratio']:.2f}x** | "
                f"{statistics.median(paired):.2f}x ({', '.join(f'{v:.2f}' for v in paired)}) | "
                f"{', '.join(f'{v:.0f}' for v in r['pixpool_runs'])} | {', '.join(f'{v:.0f}' for v in r['ultralytics_runs'])} |"
            )
        lines += [
            "",
            (
                "A pair is one round: the two arms ran back to back, so the ratio per pair cancels the load of that moment; the ratio of medians does not. "
                "The `HSV on the trainer` rows run torch's HSV on the trainer's CPU (no GPU here), one thread: they say nothing about a GPU."
            ),
        ]
    if mem_rows:
        lines += [
            "",
            (
                f"Total PSS (MiB): one pixpool daemon with {args.mem_workers} workers and N trainer processes (each imports torch, has taken 2 batches and holds "
                f"its ring) against N Ultralytics loader processes, each with its own cache='ram' dataset and {args.mem_workers} workers, also holding after 2 batches."
            ),
            "",
            "| snapshot | trainers | pixpool service | pixpool trainers | pixpool total | Ultralytics total | ratio | without file pages: pixpool | Ultralytics | ratio |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r in mem_rows:
            lines.append(
                f"| {r['dtype']} ({r['snapshot_bytes'] / MIB:.0f} MiB) | {r['trainers']} | {r['pixpool_service'] / MIB:.0f} | {r['pixpool_trainers'] / MIB:.0f} | "
                f"{r['pixpool_total'] / MIB:.0f} | {r['ultralytics_total'] / MIB:.0f} | **{r['ratio']:.2f}x** | "
                f"{r['pixpool_no_files'] / MIB:.0f} | {r['ultralytics_no_files'] / MIB:.0f} | {r['ratio_no_files']:.2f}x |"
            )
        lines += [
            "",
            (
                "File-backed pages (shared libraries: torch, cv2, ...) are shared with every process on the machine that maps the same files, so their PSS "
                "share depends on who else runs (on this machine, other users of the Ultralytics venv); the last three columns leave them out (anonymous "
                "and shared memory only: heaps, caches, snapshot, rings)."
            ),
        ]
    for s in skipped:
        lines += ["", f"Skipped: {s}"]
    return "\n".join(lines)


def write_section(path: Path, key: str, heading: str, text: str) -> None:
    """Replace the block between ``<!-- KEY: start -->`` and ``<!-- KEY: end -->``, or append it under ``heading``."""
    import re

    start, end = f"<!-- {key}: start -->", f"<!-- {key}: end -->"
    doc = path.read_text()
    block = f"{start}\n{text}\n{end}"
    if start in doc:
        doc = re.sub(re.escape(start) + ".*?" + re.escape(end), lambda _: block, doc, flags=re.DOTALL)
    else:
        doc = doc.rstrip() + f"\n\n{heading}\n\n{block}\n"
    path.write_text(doc)


def _geometry(parser: argparse.ArgumentParser, text: str) -> dict[str, float]:
    """``degrees=10,shear=2`` -> {"degrees": 10.0, "shear": 2.0}; only the general-affine hyper-parameters."""
    out = {}
    for item in (t.strip() for t in text.split(",") if t.strip()):
        key, _, value = item.partition("=")
        if key not in ("degrees", "shear", "perspective"):
            parser.error(f"--geometry {text!r}: {key!r} is not one of degrees, shear, perspective")
        try:
            out[key] = float(value)
        except ValueError:
            parser.error(f"--geometry {text!r}: {key} needs a number, got {value!r}")
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--trainer"]:
        run_trainer(json.loads(argv[1]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 pairs of 3 timed epochs (default: 5 pairs of 8)")
    parser.add_argument("--what", default="speed,memory", help="speed, memory or both")
    parser.add_argument(
        "--tasks", default=",".join(TASKS), help=f"speed pairs to run, any of {', '.join(TASKS)} (default: all)"
    )
    parser.add_argument(
        "--arms",
        default="pixpool,ultralytics",
        help="speed: both arms (default), or 'ultralytics' alone (img/s of its loader per task, no ratio)",
    )
    parser.add_argument(
        "--pairs", type=int, default=None, help="alternating pairs per comparison (default 5; 3 with --quick)"
    )
    parser.add_argument("--epochs", type=int, default=None, help="timed epochs per run (default 8; 3 with --quick)")
    parser.add_argument("--hsv-device", type=int, default=1, help="1: also the pairs with pixpool's HSV on the trainer")
    parser.add_argument(
        "--dtype",
        default="float32,uint8",
        help="snapshot dtypes for the memory arm (uint8 is skipped where pixpool has no --dtype)",
    )
    parser.add_argument("--trainers", default="1,4", help="trainer counts for the memory arm")
    parser.add_argument(
        "--mem-workers",
        type=int,
        default=2,
        help="workers of the pixpool daemon and of each Ultralytics loader in the memory arm",
    )
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument(
        "--geometry",
        default="",
        help="speed pairs: degrees, shear, perspective for both arms, e.g. degrees=10,shear=2 (default: none, the detect defaults)",
    )
    parser.add_argument(
        "--ul-python", default=DEFAULT_UL_PYTHON, help="Python of a venv with Ultralytics (env PIXPOOL_UL_PYTHON)"
    )
    parser.add_argument("--coco128", type=Path, default=COCO128_DIR)
    parser.add_argument("--json", type=Path, default=None, help="also write the raw figures here")
    parser.add_argument(
        "--write", type=Path, default=None, help="markdown file whose 'Against Ultralytics' loader' section to replace"
    )
    args = parser.parse_args(argv)
    args.argv = argv
    args.pairs = args.pairs or (3 if args.quick else 5)
    args.epochs = args.epochs or (3 if args.quick else 8)
    args.trainers = [int(n) for n in args.trainers.split(",")]
    args.tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if set(args.tasks) - set(TASKS):
        parser.error(f"--tasks {','.join(args.tasks)!r}: each must be one of {', '.join(TASKS)}")
    args.arms = {a.strip() for a in args.arms.split(",") if a.strip()}
    if "ultralytics" not in args.arms or args.arms - {"pixpool", "ultralytics"}:
        parser.error(f"--arms {','.join(sorted(args.arms))!r}: use pixpool,ultralytics or ultralytics")
    args.geometry = _geometry(parser, args.geometry)
    what = {w.strip() for w in args.what.split(",")}
    if what - {"speed", "memory"}:
        parser.error(f"--what {args.what!r}: use speed, memory or speed,memory")
    dtypes = [t.strip() for t in args.dtype.split(",") if t.strip()]
    if set(dtypes) - {"float32", "uint8"}:
        parser.error(f"--dtype {args.dtype!r}: use float32, uint8 or both")
    skipped = []
    if "uint8" in dtypes and dtype_field() is None:
        dtypes.remove("uint8")
        skipped.append(
            "uint8 snapshot: this pixpool has no `--dtype` (DaemonConfig.dtype), so only float32 was measured."
        )
    versions = check_ul_python(args.ul_python)
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    root = Path(tempfile.mkdtemp(prefix="pxul-data-"))
    try:
        needed = set(args.tasks) | ({"detect"} if "memory" in what else set())
        dirs = {task: make_data_dir(root, task, args.coco128) for task in TASKS if task in needed}
        speed_rows = speed(args, dirs, args.ul_python) if "speed" in what else []
        mem_rows = memory(args, dirs, args.ul_python, dtypes) if "memory" in what else []
    finally:
        shutil.rmtree(root, ignore_errors=True)
    load_after = " ".join(f"{x:.2f}" for x in os.getloadavg())
    text = report(args, speed_rows, mem_rows, skipped, versions, (load_before, load_after))
    print(text)
    if args.json:
        args.json.write_text(
            json.dumps(
                {"speed": speed_rows, "memory": mem_rows, "skipped": skipped, "load": [load_before, load_after]},
                indent=1,
            )
        )
    if args.write and "detect" not in args.tasks and "memory" not in what:  # issue 18's per-task table
        heading = "## Per task against Ultralytics' loader (bench/vs_ultralytics.py --tasks segment,pose,obb, issue 18)"
        write_section(args.write, "vs-ultralytics-tasks", heading, text)
    elif args.write:
        write_section(args.write, "vs-ultralytics", "## Against Ultralytics' loader (bench/vs_ultralytics.py)", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
