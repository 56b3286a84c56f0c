"""``.ci/run`` starts from nothing every run: a new empty venv, removed afterwards; it runs
the suite in stages, says the time of each, and stops at the first that fails.

The script runs for real (bash), in a copy of its folder layout, with stand-ins for
``python3`` and for the serving check: the stand-in ``python3 -m venv DIR`` refuses a
DIR that holds anything (what a reused venv would hold) and leaves a file in each venv it
makes, so a run that reuses one fails the next run. The venvs' stand-in ``python`` logs its
arguments and exits with ``CI_RC`` where they contain ``CI_MATCH`` (a failing stage).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_PYTHON3 = r"""#!/usr/bin/env bash
# stand-in for python3: only `-m venv DIR` is expected
[ "$1" = "-m" ] && [ "$2" = "venv" ] || { echo "unexpected python3 $*" >&2; exit 9; }
dir="$3"
if [ -n "$(ls -A "$dir" 2>/dev/null)" ]; then echo "venv directory $dir is not empty: $(ls -A "$dir")" >&2; exit 3; fi
mkdir -p "$dir/bin"
printf 'PATH="%s/bin:$PATH"\n' "$dir" > "$dir/bin/activate"
printf '#!/usr/bin/env bash\necho "python $*" >> "$CI_LOG"\ncase "$*" in *"${CI_MATCH:-\x01}"*) exit "$CI_RC";; esac\n' > "$dir/bin/python"
chmod +x "$dir/bin/python"
touch "$dir/installed-by-an-earlier-run"
echo "venv $dir" >> "$CI_LOG"
"""


def _sandbox(tmp_path: Path) -> tuple[Path, dict]:
    repo = tmp_path / "repo"
    (repo / ".ci").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / ".ci" / "tests").mkdir()
    (repo / "bench" / "tests").mkdir(parents=True)
    shutil.copy(REPO / ".ci" / "run", repo / ".ci" / "run")
    (repo / ".ci" / "serve-without-torch").write_text('echo "serve-without-torch (stand-in)" >> "$CI_LOG"\n')
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(_PYTHON3)
    (bin_dir / "python3").chmod(0o755)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CI_LOG": str(tmp_path / "log"), "TMPDIR": str(tmp)}
    return repo, env


STAGE_NAMES = ["lint", "unit", "integration", "slow", "ci-scripts", "bench-scripts"]
STAGES = ["-m not slow unit", "-m not slow integration", "-m slow .", ".", "."]
UL_STAGES = ["test_ultralytics_install.py", "-m ultralytics ."]


def test_ci_run_uses_a_new_empty_venv_each_time_and_removes_it(tmp_path):
    repo, env = _sandbox(tmp_path)
    venvs = []
    for run in range(2):
        Path(env["CI_LOG"]).write_text("")
        proc = subprocess.run(
            ["bash", str(repo / ".ci" / "run")], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert proc.returncode == 0, f"run {run}: {proc.stderr}"
        log = Path(env["CI_LOG"]).read_text().splitlines()
        assert log[0] == "serve-without-torch (stand-in)", log
        assert log[-1].startswith("python -m pytest "), "pytest must run last"
        made = [line.split(" ", 1)[1] for line in log if line.startswith("venv ")]
        assert len(made) == 2, log  # the suite's venv, then the Ultralytics venv
        for venv in made:
            assert not os.path.exists(venv), f"run {run} left its venv {venv} behind"
        venvs.extend(made)
        # The whole suite first, in stages (each product test in exactly one), then the tests of
        # the CI scripts, then in the Ultralytics venv: torch with its torchvision, the dry-run
        # check that the extra keeps them, the extras (Ray Tune too), the Ultralytics tests.
        tests = [i for i, line in enumerate(log) if line.startswith("python -m pytest ")]
        assert [log[i].split(" --timeout=600 ")[1] for i in tests] == [*STAGES, *UL_STAGES], log
        # ruff, pinned, checks and format-checks the tree before the first test.
        lint = [log.index("python -m ruff check ."), log.index("python -m ruff format --check .")]
        assert log.index("python -m pip install -q ruff==0.17.6") < lint[0] < lint[1] < tests[0], log
        pair = "python -m pip install -q torch==2.14.1 torchvision==0.29.1 pytest pytest-timeout"
        assert pair in log[tests[4] : tests[5]], log
        assert f"python -m pip install -q {repo}[test,ultralytics,tune]" in log[tests[5] : tests[6]], log
        said = [line for line in proc.stdout.splitlines() if line.startswith("== stage ") and " s, exit " in line]
        assert [line.split()[2].rstrip(":") for line in said] == [*STAGE_NAMES, "ultralytics-install", "ultralytics"], (
            proc.stdout
        )
    assert len(set(venvs)) == len(venvs), "a venv directory was reused"
    assert not os.listdir(env["TMPDIR"]), "a run left something in its temporary folder"


def _run(repo: Path, env: dict, match: str, rc: int) -> tuple[subprocess.CompletedProcess, list[str]]:
    Path(env["CI_LOG"]).write_text("")
    env = {**env, "CI_MATCH": match, "CI_RC": str(rc)}
    proc = subprocess.run(
        ["bash", str(repo / ".ci" / "run")], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    tests = [line for line in Path(env["CI_LOG"]).read_text().splitlines() if line.startswith("python -m pytest ")]
    return proc, tests


def test_a_failing_stage_fails_the_run_and_no_later_stage_runs(tmp_path):
    repo, env = _sandbox(tmp_path)
    proc, tests = _run(repo, env, "-m not slow integration", 1)
    assert proc.returncode == 1, proc.stdout
    assert len(tests) == 2 and "== stage integration: " in proc.stdout and "stage slow" not in proc.stdout
    assert not os.listdir(env["TMPDIR"]), "a failed run left its venvs"


def test_an_empty_slow_stage_passes_but_an_empty_unit_stage_fails(tmp_path):
    repo, env = _sandbox(tmp_path)
    proc, tests = _run(repo, env, "-m slow .", 5)  # pytest: no test collected
    assert proc.returncode == 0 and len(tests) == len(STAGES) + len(UL_STAGES), proc.stdout + proc.stderr
    assert "== stage slow: no test selected" in proc.stdout
    proc, tests = _run(repo, env, "-m not slow unit", 5)
    assert proc.returncode == 5 and len(tests) == 1, proc.stdout
