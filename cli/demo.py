"""``pixpool demo``: the main job on the embedded synthetic dataset, end to end.

Runs in the user's shell process, which plays the operator and uses the producer only
through the command line: ``pixpool synth`` writes the synthetic dataset and ``pixpool
serve`` runs as a child process (the daemon owns every segment) serving the set's
``data.yaml``, training and validation split. Several trainer processes (spawn) attach
with different seeds and train the reference detector (``--model tiny`` by default, a CPU
size) with ``fit``; the demo prints each trainer's validation mAP per epoch and the memory
the service retains against per-trainer uint8 caches (validation streams are part of their
trainer, not more trainers), draws each run's results as a PNG, then stops the daemon with SIGTERM and checks that no segment of the project is left
behind. The exit status is non-zero if any of that fails. Needs the trainer extra.

Each trainer writes into ``PROJECT/seed-N`` (N its stream's seed); ``PROJECT`` is taken as ``pixpool train``
takes its run folder (``client/train/run_dir.py``): when it exists, the next free name
(``pixpool-demo-runs2``, ...), so an earlier demo's results and plots are never mixed with this
one's. The daemon writes its log to ``PROJECT/daemon.log``; the console shows the demo's own
steps, the epoch lines and the daemon's warnings, nothing else. Each trainer gets its ``FitConfig`` as the dataclass
(pickled by the spawn), not as a dict to rebuild. A trainer is named as every other view
names it (``pixpool memory``, ``monitor``, ``status``): by the daemon's id of its training
stream, learnt when it attaches.
"""

from __future__ import annotations

import argparse
import os
import queue as queue_mod
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def configure(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument(
        "--workdir",
        metavar="DIR",
        default=None,
        help="where the dataset and sockets go (default: a temporary folder, removed after)",
    )
    parser.add_argument(
        "--project",
        metavar="DIR",
        default="pixpool-demo-runs",
        help="where each trainer's results and checkpoints go, in DIR/seed-N; if DIR exists the demo takes the "
        "next free name (DIR2, DIR3, ...) (default ./pixpool-demo-runs)",
    )
    parser.add_argument(
        "--exist-ok",
        action="store_true",
        help="write into --project even if it exists (each trainer's results start afresh)",
    )
    parser.add_argument("--num-images", type=int, default=48, help="synthetic images (default 48)")
    parser.add_argument("--imgsz", type=int, default=128, help="training image size (default 128)")
    parser.add_argument("--workers", type=int, default=2, help="augmentation workers (default 2)")
    parser.add_argument("--trainers", type=int, default=2, help="trainer processes attached at once (default 2)")
    parser.add_argument("--epochs", type=int, default=30, help="epochs per trainer (default 30)")
    parser.add_argument("--batch-size", type=int, default=8, help="batch size (default 8)")
    parser.add_argument("--model", default="tiny", help="detector scale (default tiny)")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="give up after this long (default 600)")


def run(args: argparse.Namespace) -> int:
    from .epoch_cap import capped

    args.epochs = capped(args.epochs, "pixpool demo")
    if args.workdir is None:
        with tempfile.TemporaryDirectory(prefix="pixpool-demo-") as tmp:
            return _demo(Path(tmp), args)
    return _demo(Path(args.workdir), args)


def _demo(workdir: Path, args: argparse.Namespace) -> int:
    import yaml

    from ..client._torch import require_torch
    from ..client.child import cli_command, serve_child
    from ..client.train.fit import FitConfig, fit_process
    from ..client.train.loss_text import loss_text
    from ..client.train.run_dir import claim
    from ..ops.memory_report import memory_report, trainer_ids
    from ..ops.status_client import query_status
    from ..shared.errors import DaemonStopped, DaemonTimeout
    from ..shared.stream.config import AugmentConfig, DaemonConfig, StreamSettings
    from ..shared.stream.flags import to_argv
    from ..shared.transport.names import ring_prefix
    from ..shared.transport.spawn import spawn_context
    from ..shared.transport.store import DEFAULT

    require_torch("pixpool demo (its trainers)")
    data_dir = workdir / "data"
    subprocess.run(
        cli_command("synth", str(data_dir), "--num-images", str(args.num_images), "--seed", "0"),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    _label_backgrounds(data_dir)
    names = yaml.safe_load((data_dir / "data.yaml").read_text())["names"]
    print(
        f"[1/5] synthetic dataset: {args.num_images} images, {len(names)} classes -> {data_dir / 'data.yaml'}",
        flush=True,
    )
    before = set(DEFAULT.segments())
    serve = to_argv(DaemonConfig(data=str(data_dir / "data.yaml"), imgsz=args.imgsz, workers=args.workers))
    ok = True
    projects = {}
    names: dict[int, str] = {}  # pid -> "trainer 3 (seed 1)"
    # Made before the daemon starts: its log goes there (the console keeps the demo's own lines
    # and the daemon's warnings). A daemon that fails to start leaves that log, which says why.
    runs = claim(args.project, exist_ok=args.exist_ok)
    daemon_log = runs / "daemon.log"
    with serve_child(serve, socket_dir=str(workdir / "sock"), timeout_s=args.timeout_s, log_file=daemon_log) as (
        daemon,
        sock,
        status,
    ):
        snapshot_names = {info.name for info in status.served.values()}
        print(
            f"[2/5] daemon pid {daemon.pid} serving on {sock} with {args.workers} workers (train and val); "
            f"its log: {daemon_log}",
            flush=True,
        )
        ctx = spawn_context()
        results = ctx.Queue()
        trainers = []
        print(f"      runs go to {runs}", flush=True)
        try:
            for i in range(args.trainers):
                project = runs / f"seed-{i}"
                config = FitConfig(
                    epochs=args.epochs,
                    scale=args.model,
                    optimizer="AdamW",
                    lr=0.002,
                    device="cpu",
                    project=str(project),
                    exist_ok=args.exist_ok,
                    progress=False,
                    log_every=1000,
                    threads=max(1, (os.cpu_count() or 1) // args.trainers),
                    stream=StreamSettings(seed=i, batch_size=args.batch_size, augment=AugmentConfig(imgsz=args.imgsz)),
                )
                p = ctx.Process(target=fit_process, args=(config, sock, results), name=f"pixpool-trainer-{i}")
                p.start()
                trainers.append(p)
                projects[p.pid] = (i, project)
            deadline = time.monotonic() + args.timeout_s
            attached, reports, errors = set(), {}, {}
            shown = False
            while len(reports) + len(errors) < len(trainers):
                if daemon.poll() is not None:
                    raise DaemonStopped(f"the daemon exited with code {daemon.returncode}")
                try:
                    kind, pid, payload = results.get(timeout=0.5)
                except queue_mod.Empty:
                    if time.monotonic() > deadline:
                        raise DaemonTimeout(f"the demo did not finish within {args.timeout_s} s") from None
                    continue
                if kind == "attached":
                    attached.add(pid)
                    projects[pid] = (projects[pid][0], Path(payload))  # the folder the trainer's run claimed
                    names[pid] = trainer_name(
                        trainer_ids(query_status(sock, timeout_s=10.0).trainers), pid, projects[pid][0]
                    )
                elif kind == "epoch":
                    r = payload
                    print(
                        f"  {names[pid]}: epoch {r['epoch'] + 1}/{args.epochs} {loss_text(r, batch_size=args.batch_size)} "
                        f"mAP50 {r.get('mAP50', float('nan')):.3f} mAP50-95 {r.get('mAP50_95', float('nan')):.3f}",
                        flush=True,
                    )
                elif kind == "done":
                    reports[pid] = payload
                else:
                    errors[pid] = payload
                if not shown and len(attached) == len(trainers):
                    shown = True
                    print(f"[3/5] {len(trainers)} trainers attached; memory while they train:", flush=True)
                    _print_memory(memory_report(query_status(sock, timeout_s=10.0)))
            print("[4/5] training finished:", flush=True)
            for pid, r in sorted(reports.items()):
                project = projects[pid][1]
                png = _plot(project / "results.jsonl")
                m = r["metrics"]
                print(
                    f"  {names[pid]} on {r['device']}: {r['epochs']} epochs, {r['images_per_s']:.1f} img/s, "
                    f"final loss {r['final_loss']:.3f}, mAP50 {m.get('mAP50', float('nan')):.3f}, mAP50-95 {m.get('mAP50_95', float('nan')):.3f}, "
                    f"data wait {100 * r['data_wait_fraction']:.0f}%; results {png}; checkpoint {r['checkpoint']}",
                    flush=True,
                )
            for pid, text in sorted(errors.items()):
                print(f"  {names.get(pid) or trainer_name({}, pid, projects[pid][0])} failed: {text}", file=sys.stderr)
                ok = False
        finally:
            for p in trainers:
                p.join(30.0)
                if p.is_alive():
                    p.kill()
                    p.join(5.0)
    # Only what this demo's daemon made: its snapshot (unless it existed already) and its rings.
    mine = (ring_prefix(daemon.pid), *snapshot_names)
    left = sorted(n for n in set(DEFAULT.segments()) - before if n.startswith(mine))
    if left:
        print(f"[5/5] daemon stopped, but segments remain: {left} (run `pixpool clean`)", file=sys.stderr)
        return 1
    print(f"[5/5] daemon stopped (exit code {daemon.returncode}); no pixpool segment left in {DEFAULT}", flush=True)
    return 0 if ok and daemon.returncode == 0 else 1


def _label_backgrounds(data_dir: Path) -> None:
    """An empty label file for each image that has none. The synthetic set leaves one background
    image without a label file (the readers' case of a missing one); both mean background, but a
    missing file is what a user's data gets warned about, and here it is the demo's own choice."""
    for image in (data_dir / "images").rglob("*"):
        if image.is_file():
            label = data_dir / "labels" / image.relative_to(data_dir / "images").with_suffix(".txt")
            if label.parent.is_dir() and not label.exists():
                label.touch()


def trainer_name(ids: dict[int, int], pid: int, seed: int) -> str:
    """A trainer process by the number the other views show (``trainer_ids``), and its seed."""
    return f"trainer {ids[pid]} (seed {seed})" if pid in ids else f"trainer (pid {pid}, seed {seed})"


def _plot(results: Path) -> str:
    from ..ops.plot import plot_any, read_record
    from ..shared.errors import MissingExtraError

    try:
        return str(plot_any(read_record(results), results.with_suffix(".png")))
    except MissingExtraError as exc:
        return f"{results} (no PNG: {exc})"


def _print_memory(report: dict) -> None:
    from ..ops.view import memory_lines, processes_table, report_console

    console = report_console()
    console.print(memory_lines(report))
    console.print(processes_table(report))
    sys.stdout.flush()
