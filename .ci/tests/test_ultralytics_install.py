"""The README's Ultralytics install keeps the torch a venv has, and gives a torchvision that loads.

The README names which torchvision goes with which torch and installs the pair first, then
``pip install ".[ultralytics]"``. Ultralytics requires torchvision, and every torchvision
release pins its torch: where none is installed, pip takes the newest torchvision and replaces
the installed torch with the one it pins (and that torch's CUDA packages). The checks here ask
pip itself: ``pip install --dry-run --report -`` says what an install would put in the venv
running this test, without changing it.

Runs in any venv with torch (skips without). CI runs it in its Ultralytics venv between the
README's two commands (torch 2.14.1 and torchvision 0.29.1 installed, the extra not yet), and
in the suite's venv (torch 2.13.0+cpu, no torchvision; its CPU torchvision is on PyTorch's CPU
index, which the project's machine cannot reach: that check then skips, saying so). pip
resolves against the package index, as CI's installs do.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
_PAIR = re.compile(r"torch\s+(\d+\.\d+\.\d+)\s+with\s+torchvision\s+(\d+\.\d+\.\d+)")  # a pair may wrap
_TABLE_ROW = re.compile(r"^\| (\d+\.\d+\.\d+) \| (\d+\.\d+\.\d+) \|", re.MULTILINE)
_INSTALL_LINE = re.compile(
    r'pip install torch==(\S+) torchvision==(\S+)(?: --index-url \S+)? && pip install "\.\[ultralytics\]"'
)
# Distributions that only come with a torch build (the CUDA libraries of torch's Linux wheels
# and its compiler). nvidia-ml-py is not one: Ultralytics itself requires it, a pure-Python
# NVML binding of a few hundred kB.
_TORCH_BUILD = re.compile(r"^(torch|triton|cuda-.*|nvidia-(?!ml-py$).*)$")
_PIP_TIMEOUT_S = 300


def _readme_pairs() -> dict[str, str]:
    return dict(_PAIR.findall((REPO / "README.md").read_text()))


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _dry_run(*requirements: str, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "-q", "--report", "-", *extra, *requirements]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=_PIP_TIMEOUT_S, check=False)


def _installs(done: subprocess.CompletedProcess) -> list[dict]:
    """The entries of a dry run's report: what ``pip install`` would install into this venv."""
    assert done.returncode == 0, f"{' '.join(done.args)} failed:\n{done.stderr[-3000:]}"
    return json.loads(done.stdout)["install"]


def test_readme_and_usage_name_the_same_pairs_and_install_one_of_them():
    pairs = _readme_pairs()
    assert len(pairs) >= 3, f"README.md names {pairs}: expected 'torch X with torchvision Y' for each release line"
    usage = dict(_TABLE_ROW.findall((REPO / "docs" / "usage.md").read_text()))
    assert usage == pairs, f"docs/usage.md's table {usage} differs from README.md's pairs {pairs}"
    for doc in ("README.md", "docs/usage.md", "docs/ultralytics.md"):
        lines = _INSTALL_LINE.findall((REPO / doc).read_text().replace("\n", " "))
        assert lines, f'{doc} has no `pip install torch==X torchvision==Y && pip install ".[ultralytics]"` line'
        for torch_version, vision in lines:
            assert pairs.get(torch_version) == vision, f"{doc}'s install line pairs torch {torch_version} with {vision}"


@pytest.mark.parametrize("torch_version, vision", sorted(_readme_pairs().items()))
def test_each_named_torchvision_accepts_its_torch(torch_version, vision):
    # Only the torchvision's own metadata: --no-deps and --ignore-installed resolve nothing else.
    (entry,) = _installs(_dry_run(f"torchvision=={vision}", extra=("--no-deps", "--ignore-installed")))
    wants = [Requirement(r) for r in entry["metadata"].get("requires_dist", [])]
    (torch_req,) = [r for r in wants if r.name == "torch" and (r.marker is None or r.marker.evaluate())]
    assert Version(torch_version) in torch_req.specifier, f"torchvision {vision} requires {torch_req}"


def test_the_installed_torchvision_loads_its_operators():
    # pip installs PyPI's torchvision (a CUDA build) beside a CPU torch without complaint, and
    # `import torchvision` then fails: "operator torchvision::nms does not exist".
    if _installed("torchvision") is None:
        pytest.skip("no torchvision in this venv")
    probe = "import torch, torchvision; b = torch.tensor([[0., 0, 9, 9], [1, 1, 10, 10]]); "
    probe += "print(torchvision.ops.nms(b, torch.tensor([0.9, 0.8]), 0.5).tolist())"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "[0]", (
        f"torch {_installed('torch')} with torchvision {_installed('torchvision')}: {done.stderr[-2000:]}"
    )


def test_the_ultralytics_extra_keeps_the_installed_torch():
    torch_version = _installed("torch")
    if torch_version is None:
        pytest.skip("no torch in this venv: nothing to keep (CI runs this in its venvs with torch)")
    release = Version(torch_version)
    vision = _readme_pairs().get(release.public)
    assert vision, f"README.md names no torchvision for torch {release.public} (this venv's): add the pair"
    have = _installed("torchvision")
    if have is not None:
        assert Version(have).public == vision, (
            f"this venv has torchvision {have}; README pairs torch {release} with {vision}"
        )
        requirements = [f"{REPO}[ultralytics]"]  # the README's second command
    else:
        # The README's two commands at once; a local build (2.13.0+cpu) takes the torchvision of its build.
        wanted = f"{vision}+{release.local}" if release.local else vision
        if _dry_run(f"torchvision=={wanted}", extra=("--no-deps", "--ignore-installed")).returncode != 0:
            pytest.skip(f"torch {torch_version} needs torchvision {wanted}, of its build, which this pip cannot find")
        requirements = [f"torchvision=={wanted}", f"{REPO}[ultralytics]"]
    done = _dry_run(*requirements)
    installs = {e["metadata"]["name"].lower(): e["metadata"]["version"] for e in _installs(done)}
    assert "ultralytics" in installs or _installed("ultralytics"), installs
    replaced = {n: v for n, v in installs.items() if _TORCH_BUILD.match(n)}
    assert not replaced, f"installing the extra beside torch {torch_version} would install {replaced}"
    assert Version(installs.get("torchvision", vision)).public == vision, installs
