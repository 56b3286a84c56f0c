"""Commands that start processes for the user never run code from the working directory.

``pixpool digest`` (its temporary daemon and that daemon's spawned workers), ``pixpool demo``
(its ``synth`` and ``serve`` children, its spawned trainers) and ``pixpool yolo train`` (its
daemon) are run as a user would, with the console script, from a folder holding a planted
``pixpool/`` package (an unpacked archive, a shared project folder, /tmp) and from the parent
of a checkout named ``pixpool``. Every planted ``__init__.py`` writes a marker file when it is
imported: none may appear, and each command must work.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pixpool.server
from pixpool.shared.transport.store import DEFAULT

PIXPOOL = Path(sys.executable).with_name("pixpool")  # the console script of this interpreter's environment
SIDES = ("shared", "server", "client", "integrations")


def _plant(cwd: Path, markers: Path) -> None:
    """``cwd/pixpool/`` (and ``cwd/multiprocessing/``) with ``__init__.py`` files that leave a marker
    in ``markers`` when imported."""
    for part in ("", "shared", "server", "client"):
        pkg = cwd / "pixpool" / part
        pkg.mkdir(parents=True, exist_ok=True)
        marker = markers / (f"pixpool.{part}" if part else "pixpool")
        (pkg / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('imported from the working directory')\n")
    # A spawned child imports multiprocessing before its bootstrap sets sys.path.
    (cwd / "multiprocessing").mkdir()
    marker = markers / "multiprocessing"
    (cwd / "multiprocessing" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")


def _checkout(parent: Path, markers: Path) -> None:
    """``parent/pixpool/``: a source checkout as git lays it out (no built kernel), marked."""
    root = Path(pixpool.server.__path__[0]).parent
    for side in SIDES:
        shutil.copytree(root / side, parent / "pixpool" / side, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    for side in ("shared", "server", "client"):
        init = parent / "pixpool" / side / "__init__.py"
        init.write_text(f"open({str(markers / ('checkout.' + side))!r}, 'w').write('x')\n" + init.read_text())


def _run(cwd: Path, *argv: str, timeout_s: float = 240.0) -> subprocess.CompletedProcess:
    return subprocess.run([str(PIXPOOL), *argv], cwd=cwd, capture_output=True, text=True, timeout=timeout_s)


def _digest_flags(data: Path) -> list[str]:
    return [str(data), "--batches", "1", "--batch-size", "2", "--imgsz", "64", "--processes", "1", "--json"]


@pytest.fixture
def planted(tmp_path):
    """(working directory with a planted pixpool/, markers folder)."""
    markers = tmp_path / "markers"
    markers.mkdir()
    cwd = tmp_path / "work"
    cwd.mkdir()
    _plant(cwd, markers)
    return cwd, markers


@pytest.fixture
def checkout_parent(tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    parent = tmp_path / "src"
    parent.mkdir()
    _checkout(parent, markers)
    return parent, markers


@pytest.mark.parametrize("where", ["planted", "checkout_parent"])
def test_digest_daemon_ignores_the_working_directory(where, request, synthetic_data):
    cwd, markers = request.getfixturevalue(where)
    before = set(DEFAULT.segments())
    ref = _run(cwd, "digest", *_digest_flags(synthetic_data.coco_json), "--reference")
    daemon = _run(cwd, "digest", *_digest_flags(synthetic_data.coco_json), "--workers", "1")
    assert sorted(p.name for p in markers.iterdir()) == [], "code from the working directory was imported"
    assert ref.returncode == 0, ref.stderr
    assert daemon.returncode == 0, daemon.stderr
    assert json.loads(daemon.stdout)["digests"] == json.loads(ref.stdout)["digests"]
    assert set(DEFAULT.segments()) == before


def test_demo_ignores_the_working_directory(planted, tmp_path):
    cwd, markers = planted
    before = set(DEFAULT.segments())
    proc = _run(
        cwd,
        "demo",
        "--workdir",
        str(tmp_path / "demo"),
        "--project",
        str(tmp_path / "runs"),
        "--num-images",
        "8",
        "--imgsz",
        "64",
        "--epochs",
        "1",
        "--batch-size",
        "4",
        "--trainers",
        "1",
        "--workers",
        "1",
        "--timeout-s",
        "200",
    )
    assert sorted(p.name for p in markers.iterdir()) == [], "code from the working directory was imported"
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no pixpool segment left" in proc.stdout
    assert set(DEFAULT.segments()) == before


@pytest.mark.ultralytics
def test_yolo_train_ignores_the_working_directory(planted, synthetic_copy, tmp_path):
    pytest.importorskip("ultralytics", reason="Ultralytics is not installed here; CI runs these in its own venv")
    cwd, markers = planted
    before = set(DEFAULT.segments())
    env = {**os.environ, "YOLO_OFFLINE": "1", "YOLO_CONFIG_DIR": str(tmp_path / "ultralytics-config")}
    argv = [
        str(PIXPOOL),
        "yolo",
        "train",
        f"data={synthetic_copy / 'data.yaml'}",
        "model=yolo11n.yaml",
        "epochs=1",
        "imgsz=64",
        "batch=4",
        "workers=1",
        "device=cpu",
        "plots=False",
        f"project={tmp_path / 'runs'}",
        "name=run",
    ]
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=400)
    assert sorted(p.name for p in markers.iterdir()) == [], "code from the working directory was imported"
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "starting a daemon (1 workers" in proc.stderr
    assert set(DEFAULT.segments()) == before


def test_child_interpreters_keep_the_working_directory_off_sys_path():
    """Every command line pixpool starts a Python child with runs it in safe-path mode (``-P``)."""
    from pixpool.client.child import cli_command

    argv = cli_command("serve", "x")
    assert argv[0] == sys.executable and "-P" in argv[1 : argv.index("-m")]
