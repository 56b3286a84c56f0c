"""Ultralytics' Ray Tune search with every trial on one pixpool daemon (``integrations/ultralytics/tuning.py``).

Skipped where Ultralytics or Ray Tune is not importable (CI's Ultralytics venv installs
``pixpool[ultralytics,tune]``). Offline and small: the synthetic set (24 images), imgsz 320,
batch 8, 1 epoch, ``yolo11n.yaml`` from scratch on the CPU, Ray's random search (Optuna
is not installed). Ray's start and stop take about 10 s of each test's time.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytest.importorskip(
    "ultralytics",
    reason="Ultralytics is not installed here (pip install 'pixpool[ultralytics]'); CI runs these in its own venv",
)
pytest.importorskip("ray.tune", reason="Ray Tune is not installed here (pip install 'pixpool[tune]')")

import psutil

from helpers.daemon import real_daemon
from pixpool.shared.transport.store import DEFAULT

pytestmark = pytest.mark.ultralytics

TRIAL = dict(model="yolo11n.yaml", epochs=1, imgsz=320, device="cpu", workers=1, plots=False)


def _offline(tmp_path) -> dict[str, str]:
    return {"YOLO_OFFLINE": "1", "YOLO_CONFIG_DIR": str(tmp_path / "ultralytics-config")}


def _marked(mark: str) -> list[psutil.Process]:
    """Processes whose environment carries ``mark``: every process the run started (Ray's own
    included: its raylet and workers inherit the driver's environment), whoever is their parent now."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("PIXPOOL_TEST_TUNE_MARK") == mark:
                found.append(proc)
        except psutil.Error:
            pass
    return found


def _trainers(socket_dir) -> list:
    """The training streams of the daemon at ``socket_dir`` (none while it does not answer yet)."""
    from helpers.daemon import ask_status

    status = ask_status(str(socket_dir), 1.0) if os.path.exists(socket_dir / "daemon.sock") else None
    return [t for t in (status or {}).get("trainers", []) if t.get("split", "train") == "train"]


def test_yolo_tune_runs_three_trials_on_one_daemon(synthetic_data, tmp_path):
    """``pixpool yolo tune``: 3 concurrent trials, each a pixpool trainer with its own sampled
    augmentation, all attached to the one daemon the command started; each trial's metrics
    printed; nothing left behind (daemon, rings, snapshot, Ray's processes)."""
    mark = uuid.uuid4().hex
    pairs = {
        **TRIAL,
        "data": synthetic_data.data_yaml,
        "batch": 8,
        "iterations": 3,
        "concurrent": 3,
        "search_alg": "random",
        "space": "{'mosaic': (0.0, 1.0), 'degrees': (0.0, 10.0), 'hsv_h': (0.0, 0.05)}",
        "project": tmp_path / "runs",
        "name": "search",
    }
    cmd = [sys.executable, "-m", "pixpool.cli", "yolo", "tune", *(f"{k}={v}" for k, v in pairs.items())]
    env = {**os.environ, **_offline(tmp_path), "YOLO_VERBOSE": "True", "PIXPOOL_TEST_TUNE_MARK": mark}
    try:
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=480)
    finally:
        left = _marked(mark)
        for proc in left:
            proc.kill()
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    trials = [line for line in run.stdout.splitlines() if re.match(r"pixpool yolo tune: _tune_\w+: ", line)]
    assert len(trials) == 3, run.stdout
    for line in trials:
        assert "metrics/mAP50-95(B) " in line and "mosaic=" in line, line
    assert "pixpool yolo tune: 3 of 3 trials finished" in run.stdout
    # One daemon, started once by the driver; three trainers on it, one per trial, each its own process.
    assert out.count("pixpool: starting a daemon") == 1, out[-4000:]
    # Its log is in the search's folder, numbering the trials' trainers 1, 2, 3 (validation is no trainer).
    folder = re.search(r"results in (\S+)$", run.stdout.strip()).group(1)
    log = (Path(folder) / "pixpool-daemon.log").read_text()
    assert "INFO pixpool.server." not in run.stderr, run.stderr[-4000:]  # its warnings stay
    attached = re.findall(r"trainer (\d+) attached \(pid (\d+), seed \d+, batch 8,", log)
    assert [n for n, _ in attached] == ["1", "2", "3"] and len({pid for _, pid in attached}) == 3, attached
    assert left == [], [p.info for p in left]
    # The daemon's snapshot and rings, named in its log, are gone (other runs on this machine may
    # hold segments of their own meanwhile: only this run's names are checked).
    named = set(re.findall(r"\b(pixpool-u\d+-(?:snap|ring)-[0-9a-f]+(?:-[0-9a-f]+)?)", out + log))
    assert any("-snap-" in n for n in named) and any("-ring-" in n for n in named), named
    assert [s for s in DEFAULT.segments() if any(s.startswith(n) for n in named)] == []


def test_ctrl_c_stops_the_search_its_daemon_and_rays_processes(synthetic_data, tmp_path):
    """Ctrl-C (SIGINT to the foreground group) while a trial trains: Ray Tune stops the
    search, the trial is reported stopped (exit 1), and the daemon the command started, its
    snapshot and rings, and every process of the run (Ray's included) are gone."""
    from helpers.daemon import wait_for

    mark = uuid.uuid4().hex
    pairs = {**TRIAL, "data": synthetic_data.data_yaml, "epochs": 50, "imgsz": 160, "batch": 8, "iterations": 1}
    pairs.update(concurrent=1, search_alg="random", space="{'mosaic': (0.0, 1.0)}", project=tmp_path / "runs")
    sock = tmp_path / "sock"  # the daemon the command starts: asked through its socket (its log is the run's)
    pairs["socket_dir"] = sock
    log_path = tmp_path / "out.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pixpool.cli", "yolo", "tune", *(f"{k}={v}" for k, v in pairs.items())],
            env={**os.environ, **_offline(tmp_path), "YOLO_VERBOSE": "True", "PIXPOOL_TEST_TUNE_MARK": mark},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # A shell runs background jobs with SIGINT ignored: take Ctrl-C as a foreground job does.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    try:
        wait_for(lambda: _trainers(sock), timeout_s=180, what="a trial attached")
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        left = _marked(mark)
        for p in left:
            p.kill()
    out = log_path.read_text()
    assert code == 1 and "pixpool yolo tune: 0 of 1 trials finished, 1 stopped" in out, out[-3000:]
    started = re.search(r"pixpool: started daemon (\d+) at \S+: snapshot (\S+) ", out)
    daemon_pid, snapshot = int(started.group(1)), started.group(2)
    assert not psutil.pid_exists(daemon_pid) or psutil.Process(daemon_pid).status() == psutil.STATUS_ZOMBIE
    assert [seg for seg in DEFAULT.segments() if seg.startswith(snapshot)] == []
    assert left == [], left


def test_tune_reports_a_trial_the_memory_budget_refuses(synthetic_data, tmp_path, monkeypatch):
    """A daemon whose --memory-budget holds the snapshot and two trials (their training rings
    and validation rings at once) but not a third trial's ring: that trial errors with the
    daemon's refusal, naming --memory-budget and the byte counts, and the summary names it;
    the other two finish."""
    from ray import tune as ray_tune

    from pixpool.integrations.ultralytics import tune
    from pixpool.integrations.ultralytics.tuning import summary_lines

    for k, v in _offline(tmp_path).items():
        monkeypatch.setenv(k, v)
    # The snapshot's bytes, from a first daemon of the same data and imgsz.
    with real_daemon(synthetic_data.data_yaml, imgsz=320, workers=1) as (_, sdir):
        from helpers.daemon import ask_status

        name = ask_status(sdir)["snapshot"]["name"]
        snapshot_nbytes = sum(os.stat(f"/dev/shm/{n}").st_size for n in DEFAULT.segments() if n.startswith(name))
    # A ring of batch 8 at 320 is ~7.4 MB, a validation ring of batch 16 ~18 MB: two trials
    # at their most (both validating) take ~51 MB, well under 64 MiB; batch 128's ring alone
    # is ~118 MB, refused whatever else is attached.
    budget = snapshot_nbytes + 64 * 2**20
    with real_daemon(synthetic_data.data_yaml, imgsz=320, workers=1, memory_budget_nbytes=budget) as (_, sdir):
        results = tune(
            **TRIAL,
            data=str(synthetic_data.data_yaml),
            socket_dir=sdir,
            iterations=1,
            concurrent=3,
            search_alg="random",
            space={"batch": ray_tune.grid_search([8, 8, 128]), "mosaic": (0.0, 1.0)},
            project=str(tmp_path / "runs"),
            name="budget",
        )
    lines = summary_lines(results)
    failed = [line for line in lines if ": failed: " in line]
    assert len(failed) == 1 and sum("metrics/mAP50-95(B) " in line for line in lines) == 2, lines
    assert "CapacityError" in failed[0] and "--memory-budget" in failed[0], failed[0]
    assert f"memory budget of {budget} bytes" in failed[0], failed[0]


def test_search_space_pairs_become_ray_domains_and_refused_keys_are_named():
    from ray import tune as ray_tune

    from pixpool.integrations.ultralytics.tuning import search_space
    from pixpool.shared.errors import ConfigError

    space = search_space({"mosaic": (0.0, 1.0), "lr0": [1e-4, 1e-2, 0.5], "batch": ray_tune.choice([8, 16])}, ray_tune)
    assert (space["mosaic"].lower, space["mosaic"].upper) == (0.0, 1.0)
    assert (space["lr0"].lower, space["lr0"].upper) == (1e-4, 1e-2)
    assert space["batch"].categories == [8, 16]
    with pytest.raises(ConfigError, match=r"space sweeps bgr, which pixpool refuses: .*remove bgr from space="):
        search_space({"bgr": (0.0, 1.0)}, ray_tune)
    with pytest.raises(ConfigError, match=r"space key mosaic: .* is not \(low, high\)"):
        search_space({"mosaic": (0.0,)}, ray_tune)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"use_ray": False}, r"use_ray=False is Ultralytics' own sequential tuner"),
        ({"concurrent": 0}, r"concurrent=0: give a whole number of trials at once"),
        ({"space": {"bgr": (0.0, 1.0)}}, r"space sweeps bgr"),
    ],
)
def test_tune_refuses_what_it_cannot_run_before_anything_starts(given, message, synthetic_data):
    from pixpool.integrations.ultralytics import tune
    from pixpool.shared.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        tune(**TRIAL, data=str(synthetic_data.data_yaml), search_alg="random", **given)
    assert _children() == []  # refused before Ray or a daemon started


def test_tune_names_optuna_when_the_default_searcher_is_missing(synthetic_data):
    import importlib.util

    from pixpool.integrations.ultralytics import tune
    from pixpool.shared.errors import ConfigError

    if importlib.util.find_spec("optuna") is not None:
        pytest.skip("optuna is installed here: Ultralytics' default searcher runs")
    with pytest.raises(ConfigError, match=r"search_alg=optuna .* needs the optuna package: pip install optuna"):
        tune(**TRIAL, data=str(synthetic_data.data_yaml))  # search_alg: Ultralytics' default


def _children() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if "resource_tracker" not in " ".join(p.cmdline())]


def test_the_default_searcher_is_installed_with_the_tune_extra():
    """``pixpool yolo tune`` without ``search_alg=`` runs Ultralytics' default, Optuna: the venv
    of ``pixpool[ultralytics,tune]`` has it, so the check before Ray starts passes."""
    from pixpool.integrations.ultralytics.tuning import _check_search

    _check_search("optuna")
