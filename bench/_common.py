"""What the bench scripts share: paths, alternating rounds, paired ratios, tables, daemons, data.

Runs in whichever process imports it: a bench script's measurer, and the daemons and trainers
it spawns (which import it again). Owns nothing beyond a call: every daemon, socket folder and
snapshot a helper makes is removed by that helper (``daemon`` and ``prepared`` are context
managers), so an interrupted run leaves at most what ``pixpool clean`` sweeps.

How figures are taken (docs/benchmarks.md): every comparison runs its arms in one invocation,
alternating round by round (``rounds``: the order reverses every other round, or rotates), and
reports each arm's median and the ratio paired per round (``ratios``), every round listed, with
the load average before and after (``load``): the machine is shared, and a ratio of two arms
that ran back to back cancels most of the load of that moment.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The coco128 folder (bench/coco128.py builds one from its two downloads): PIXPOOL_COCO128, else
# the shared data folder beside the checkout.
COCO128 = Path(os.environ.get("PIXPOOL_COCO128") or ROOT.parent / "shared" / "data" / "coco128").absolute()
COCO128_JSON = COCO128 / "annotations" / "instances_train2017.json"
COCO128_IMAGES = COCO128 / "images" / "train2017"
# The Python of a venv with Ultralytics (never pixpool's own: Ultralytics is no dependency).
UL_PYTHON = os.environ.get("PIXPOOL_UL_PYTHON", "/work/venv-ul/bin/python")
WAIT_S = 300.0
MIB = 1 << 20


# -- rounds and ratios ------------------------------------------------------------------------
def load() -> str:
    """The load average (1, 5, 15 min), as every table prints it."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def cpu_s(*, children: bool = False) -> float:
    """CPU seconds (user + system) of this process, and of its reaped children with ``children``."""
    who = [resource.RUSAGE_SELF, *([resource.RUSAGE_CHILDREN] if children else [])]
    return sum(u.ru_utime + u.ru_stime for u in map(resource.getrusage, who))


def alternate(names: Sequence, r: int, *, rotate: bool = False) -> list:
    """The order of round ``r``: reversed every other round, or (``rotate``) shifted by ``r``."""
    names = list(names)
    if rotate:
        k = r % len(names)
        return names[k:] + names[:k]
    return names if r % 2 == 0 else names[::-1]


def rounds(arms: dict[str, Callable[[], object]], n: int, *, rotate: bool = False, warmup: bool = False) -> dict:
    """Run every arm once per round, ``n`` rounds in alternating order; each arm's results in
    round order. ``warmup``: one unrecorded call of each arm first (imports, page cache)."""
    if warmup:
        for arm in arms.values():
            arm()
    out: dict[str, list] = {name: [] for name in arms}
    for r in range(n):
        for name in alternate(arms, r, rotate=rotate):
            out[name].append(arms[name]())
    return out


def ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """a / b round by round (the arms of one round ran back to back)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired rounds need two equal, non-empty lists, got {len(a)} and {len(b)}")
    return [x / y for x, y in zip(a, b)]


def paired(a: Sequence[float], b: Sequence[float]) -> str:
    """``1.23x (1.10, 1.31, ...)``: the median of the per-round ratios a / b, and every round's."""
    r = ratios(a, b)
    return f"{statistics.median(r):.2f}x ({', '.join(f'{x:.2f}' for x in r)})"


# What a figure needs before a document may quote it as a headline: enough pairs, and pairs
# that agree (a lucky or unlucky set of rounds is not a result an outside run would reproduce).
HEADLINE_PAIRS = 5
HEADLINE_SPREAD = 0.25


def spread(values: Sequence[float]) -> float:
    """(largest - smallest) / median: how far a set of per-pair ratios disagree."""
    return (max(values) - min(values)) / statistics.median(values)


def headline(a: Sequence[float], b: Sequence[float]) -> tuple[float | None, str]:
    """(the median per-pair ratio a / b, or None; why not) for a figure the README may quote:
    None from fewer than ``HEADLINE_PAIRS`` pairs or from pairs spread over ``HEADLINE_SPREAD``."""
    r = ratios(a, b)
    if len(r) < HEADLINE_PAIRS:
        return None, f"none: {len(r)} pairs, a headline needs {HEADLINE_PAIRS}"
    if spread(r) > HEADLINE_SPREAD:
        return None, f"none: the pairs spread {spread(r):.0%} (over {HEADLINE_SPREAD:.0%}); rerun on a quieter machine"
    return statistics.median(r), f"**{statistics.median(r):.2f}x**"


def runs(values: Sequence[float], fmt: str = ".1f") -> str:
    """Every round's figure, in round order."""
    return ", ".join(format(v, fmt) for v in values)


# -- reporting --------------------------------------------------------------------------------
def table(header: Sequence[str], rows: Sequence[Sequence], *, left: int = 1) -> str:
    """A markdown table; the first ``left`` columns are text, the others numbers (right-aligned)."""
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" if i < left else "---:" for i in range(len(header))) + " |"]  # fmt: skip
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def dump(report: dict) -> None:
    """Print a JSON report (floats as they are; numpy scalars as floats)."""
    print(json.dumps(report, indent=1, default=float), flush=True)


def write_section(path: Path, key: str, text: str, heading: str) -> None:
    """Put ``text`` between ``<!-- KEY: start -->`` and ``<!-- KEY: end -->`` in ``path``,
    replacing what was there, or append it under ``heading`` where the markers are absent."""
    start, end = f"<!-- {key}: start -->", f"<!-- {key}: end -->"
    doc = path.read_text() if path.exists() else "# Benchmarks\n"
    block = f"{start}\n{text}\n{end}"
    if start in doc and end in doc:
        head, _, rest = doc.partition(start)
        doc = head + block + rest.partition(end)[2]
    else:
        doc = doc.rstrip() + f"\n\n{heading}\n\n{block}\n"
    path.write_text(doc)


_RUNNING: dict = {}  # the script's questions, for the help of the one being run


def dispatch(whats: dict[str, tuple[Callable[[list[str]], int | None], str]], argv: list[str] | None = None) -> int:
    """Run one question of a script: ``--what NAME`` (default: the first of ``whats``, each a
    ``main(argv)`` and a line saying what it measures); the other arguments go to that ``main``."""
    argv = sys.argv[1:] if argv is None else list(argv)
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--what", choices=list(whats), default=next(iter(whats)))
    known, rest = pre.parse_known_args(argv)
    _RUNNING.update(whats={name: line for name, (_, line) in whats.items()})
    return whats[known.what][0](rest) or 0


class _Parser(argparse.ArgumentParser):
    """Parses as argparse does, and keeps the command line that reproduces the run (``args.command``)."""

    def parse_args(self, args=None, namespace=None):
        argv = list(sys.argv[1:] if args is None else args)
        ns = super().parse_args(argv, namespace)
        ns.argv, ns.command = argv, " ".join(["python bench/" + self.prog, *argv])
        return ns


def parser(doc: str, command: str) -> argparse.ArgumentParser:
    """The parser of one question, ``command`` (e.g. ``route.py --what kernel``): described by
    ``doc``'s first paragraph; its help lists the script's other questions (``--what``)."""
    others = "\n".join(f"  --what {name}: {line}" for name, line in _RUNNING.get("whats", {}).items())
    return _Parser(
        prog=command,
        description=inspect.cleandoc(doc).split("\n\n")[0],
        epilog=f"questions of this script:\n{others}" if others else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def serving_args(p: argparse.ArgumentParser, *, rounds: int, epochs_per_round: int) -> None:
    """The options of a question that reads one daemon in alternating rounds of a few epochs."""
    p.add_argument("--data", default=str(COCO128_JSON))
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=rounds, help="alternating rounds")
    p.add_argument("--epochs-per-round", type=int, default=epochs_per_round, help="epochs each arm reads per round")


# -- other processes --------------------------------------------------------------------------
def run_json(argv: list[str], *, env: dict | None = None, timeout_s: float = WAIT_S) -> dict:
    """Run ``argv`` and return the JSON object on its last line of stdout; its stderr's tail on failure."""
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} ... exited with {proc.returncode}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def ul_version(python: str) -> str:
    """'ULTRALYTICS TORCH' versions in that Python, or exit saying how to make one."""
    code = "import ultralytics, torch; print(ultralytics.__version__, torch.__version__)"
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    except FileNotFoundError:
        out = None
    if out is None or out.returncode != 0:
        raise SystemExit(
            f"{python} cannot import ultralytics: make a venv with `pip install torch==2.14.1 torchvision==0.29.1 "
            "ultralytics` and pass --ul-python VENV/bin/python (or set PIXPOOL_UL_PYTHON)"
        )
    ultralytics, torch = out.stdout.split()
    return f"{ultralytics} (torch {torch})"


def rollup(pid: int) -> dict[str, int]:
    """``/proc/PID/smaps_rollup`` as bytes per field; {} for a process that is gone."""
    from pixpool.shared.transport.procmem import parse_rollup

    try:
        return parse_rollup(Path(f"/proc/{pid}/smaps_rollup").read_text())
    except (FileNotFoundError, ProcessLookupError):
        return {}


def tree(pid: int) -> list[int]:
    """A process and all its descendants (a loader and its workers)."""
    import psutil

    return [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]


# -- daemons ----------------------------------------------------------------------------------
def status(socket_dir: str, *, timeout_s: float = 3.0):
    """The daemon's status reply with attribute access: the typed reply, or, from a base whose
    client still returns the reply's dict (``--base`` of an older commit), that dict's keys as
    attributes, nested."""
    from types import SimpleNamespace

    from pixpool.ops.status_client import query_status

    def attrs(value):
        if isinstance(value, dict):
            return SimpleNamespace(**{k: attrs(v) for k, v in value.items()})
        if isinstance(value, list):
            return [attrs(v) for v in value]
        return value

    return attrs(query_status(socket_dir, timeout_s=timeout_s))


def wait_ready(socket_dir: str, workers: int, proc=None, timeout_s: float = WAIT_S, poll_s: float = 0.1):
    """The daemon's first status that lists ``workers`` started workers (bounded wait); ``proc``
    (a ``multiprocessing`` process or a ``Popen``) must not exit meanwhile."""
    from pixpool.shared.errors import DaemonTimeout

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        code = getattr(proc, "exitcode", None) if hasattr(proc, "is_alive") else proc and proc.poll()
        if code is not None:
            raise RuntimeError(f"the daemon exited with {code} before it was ready")
        try:
            st = status(socket_dir, timeout_s=1.0)
            if len(st.workers) == workers and all(w.pid for w in st.workers):
                return st
        except (DaemonTimeout, FileNotFoundError, ConnectionError):
            pass
        time.sleep(poll_s)  # polling interval of a bounded wait
    raise TimeoutError(f"daemon in {socket_dir} not ready within {timeout_s} s")


@contextlib.contextmanager
def daemon(*, workers: int, socket_dir: str | None = None, **fields) -> Iterator[tuple[str, object]]:
    """A daemon (``DaemonConfig(workers=..., **fields)``) in a spawned process, ready; yields
    (socket folder, process). Stopped (SIGTERM: it unlinks its rings, and its snapshot unless
    kept) and its socket folder removed on exit."""
    import multiprocessing as mp

    from pixpool.server.daemon.run import run_daemon, stop_process
    from pixpool.shared.stream.config import DaemonConfig

    d = socket_dir or tempfile.mkdtemp(prefix="pxbench-")
    proc = mp.get_context("spawn").Process(
        target=run_daemon, args=(DaemonConfig(workers=workers, socket_dir=d, **fields),)
    )
    proc.start()
    try:
        wait_ready(d, workers, proc)
        yield d, proc
    finally:
        stop_process(proc, timeout_s=60.0)
        shutil.rmtree(d, ignore_errors=True)


# -- data -------------------------------------------------------------------------------------
SYNTH_IMAGES = 128  # the pose and obb sets: as many images as coco128


def make_data_dir(root: Path, task: str = "detect", coco128: Path = COCO128) -> Path:
    """A YOLO dataset folder (``data.yaml``, ``images/``, ``labels/``) for ``task``: symlinks into
    coco128 (``labels-seg`` for segment), or ``pixpool synth --task pose|obb`` (coco128 has
    neither: 128 images, seed 0). Returns the folder."""
    import yaml

    if task in ("pose", "obb"):
        from pixpool.server.synthetic import write_synthetic

        return write_synthetic(root / task, num_images=SYNTH_IMAGES, seed=0, task=task).root
    labels = coco128 / ("labels-seg" if task == "segment" else "labels") / "train2017"
    images = coco128 / "images" / "train2017"
    if not images.is_dir() or not labels.is_dir():
        raise SystemExit(f"coco128 not found at {coco128} (need images/train2017 and {labels.parent.name}/train2017)")
    d = root / task
    for link, target in ((d / "images" / "train2017", images), (d / "labels" / "train2017", labels)):
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(target, target_is_directory=True)
    cats = json.loads((coco128 / "annotations" / "instances_train2017.json").read_text())["categories"]
    names = [c["name"] for c in sorted(cats, key=lambda c: c["id"])]
    (d / "data.yaml").write_text(yaml.safe_dump({"path": ".", "train": "images/train2017", "names": names}))
    return d


@contextlib.contextmanager
def prepared(dataset, **options) -> Iterator[object]:
    """``prepare_snapshot(dataset, PrepareOptions(**options))``; on exit closed, and unlinked
    unless it was another's (reused)."""
    from pixpool.server.snapshot.prepare import PrepareOptions, prepare_snapshot

    prep = prepare_snapshot(dataset, PrepareOptions(**options))
    try:
        yield prep
    finally:
        if not prep.reused:
            prep.snapshot.unlink()
        prep.snapshot.close()


class Uint8CacheSource:
    """The conventional decoded cache: every image decoded and resized once as uint8, converted
    to centred float32 on each use (an ``ImageSource`` for ``render_batch``)."""

    def __init__(self, dataset, imgsz: int):
        from pixpool.server.snapshot.decode import decode_bgr, resize_long_side

        self.dataset, self.imgsz = dataset, imgsz
        self.spec = dataset.spec
        self.cache = [resize_long_side(decode_bgr(r.image_path), imgsz) for r in dataset.records]

    def __len__(self) -> int:
        return len(self.cache)

    def image(self, index: int):
        from pixpool.server.snapshot.decode import centre

        return centre(self.cache[index])

    def targets(self, index: int):
        from pixpool.shared.stream.records import Targets

        return Targets.from_record(self.dataset.records[index])


class BatchDataset:
    """A torch map-style dataset of whole batches of the route (``DataLoader(batch_size=None)``)."""

    def __init__(self, source, settings, epoch: int):
        from pixpool.shared.stream.sampler import num_batches

        self.source, self.settings, self.epoch = source, settings, epoch
        self.n = num_batches(len(source), settings, epoch)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, b: int):
        import torch

        from pixpool.server.augment import render_batch

        out = render_batch(self.source, self.settings, self.epoch, b)
        return torch.from_numpy(out.images), torch.from_numpy(out.targets), torch.from_numpy(out.samples)
