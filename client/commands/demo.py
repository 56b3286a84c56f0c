"""``pixpool demo``: the main job on the embedded synthetic dataset, end to end.

Runs in the user's shell process, which plays the operator and uses the producer only
through the command line: ``pixpool synth`` writes the synthetic dataset and ``pixpool
serve`` runs as a child process (the daemon owns every segment). Several trainer
processes (spawn) attach with different seeds and run the training step; the demo prints
the memory the service retains against what per-trainer decoded uint8 caches would cost,
then stops the daemon with SIGTERM and checks that no segment of the project is left
behind. The exit status is non-zero if any of that fails. Needs the trainer extra (torch).
"""

from __future__ import annotations

import argparse
import queue as queue_mod
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def configure(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("--workdir", metavar="DIR", default=None, help="where the dataset and sockets go (default: a temporary folder, removed after)")
    parser.add_argument("--num-images", type=int, default=48, help="synthetic images (default 48)")
    parser.add_argument("--imgsz", type=int, default=320, help="training image size (default 320)")
    parser.add_argument("--workers", type=int, default=2, help="augmentation workers (default 2)")
    parser.add_argument("--trainers", type=int, default=2, help="trainer processes attached at once (default 2)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per trainer (default 2)")
    parser.add_argument("--batch-size", type=int, default=8, help="batch size (default 8)")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="give up after this long (default 600)")


def run(args: argparse.Namespace) -> int:
    if args.workdir is None:
        with tempfile.TemporaryDirectory(prefix="pixpool-demo-") as tmp:
            return _demo(Path(tmp), args)
    return _demo(Path(args.workdir), args)


def _demo(workdir: Path, args: argparse.Namespace) -> int:
    import multiprocessing as mp

    import yaml

    from ...shared.config import AugmentConfig, StreamSettings
    from ...shared.errors import DaemonStopped, DaemonTimeout
    from ...shared.names import list_segments, ring_prefix
    from .._torch import require_torch
    from ..child import cli_command, serve_child
    from ..loop import trainer_process
    from ..memory import memory_report
    from ..status import query_status

    require_torch("pixpool demo (its trainers)")
    data_dir = workdir / "data"
    subprocess.run(cli_command("synth", str(data_dir), "--num-images", str(args.num_images), "--seed", "0"), check=True, stdout=subprocess.DEVNULL)
    names = yaml.safe_load((data_dir / "data.yaml").read_text())["names"]
    coco_json = data_dir / "annotations" / "instances_train.json"
    print(f"[1/5] synthetic dataset: {args.num_images} images, {len(names)} classes -> {coco_json}", flush=True)
    before = set(list_segments())
    serve = [str(coco_json), "--imgsz", str(args.imgsz), "--workers", str(args.workers)]
    ok = True
    with serve_child(serve, socket_dir=str(workdir / "sock"), timeout_s=args.timeout_s) as (daemon, sock, status):
        snapshot_name = status["snapshot"]["name"]
        print(f"[2/5] daemon pid {daemon.pid} serving on {sock} with {args.workers} workers", flush=True)
        ctx = mp.get_context("spawn")
        results = ctx.Queue()
        trainers = []
        try:
            for i in range(args.trainers):
                settings = StreamSettings(seed=i, batch_size=args.batch_size, augment=AugmentConfig(imgsz=args.imgsz, epochs=args.epochs))
                p = ctx.Process(target=trainer_process, args=(settings.to_dict(), sock, args.epochs, len(names), results), name=f"pixpool-trainer-{i}")
                p.start()
                trainers.append(p)
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
                first, last = (r["losses"][0], r["losses"][-1]) if r["losses"] else (float("nan"), float("nan"))
                print(f"  trainer pid {pid} seed {r['seed']} on {r['device']}{' (CUDA graph)' if r['graph'] else ''}: "
                      f"{r['steps']} steps, {r['images_per_s']:.1f} img/s, loss {first:.3f} -> {last:.3f}, "
                      f"samples per epoch {r['samples_per_epoch']}")
            for pid, text in sorted(errors.items()):
                print(f"  trainer pid {pid} failed: {text}", file=sys.stderr)
                ok = False
        finally:
            for p in trainers:
                p.join(30.0)
                if p.is_alive():
                    p.kill()
                    p.join(5.0)
    # Only what this demo's daemon made: its snapshot (unless it existed already) and its rings.
    mine = (ring_prefix(daemon.pid), snapshot_name)
    left = sorted(n for n in set(list_segments()) - before if n.startswith(mine))
    if left:
        print(f"[5/5] daemon stopped, but segments remain: {left} (run `pixpool clean`)", file=sys.stderr)
        return 1
    print(f"[5/5] daemon stopped (exit code {daemon.returncode}); no pixpool segment left in /dev/shm", flush=True)
    return 0 if ok and daemon.returncode == 0 else 1


def _print_memory(report: dict) -> None:
    from rich.console import Console

    from ..view import memory_lines, processes_table

    console = Console(width=80)
    console.print(memory_lines(report))
    console.print(processes_table(report))
    sys.stdout.flush()
