"""Every shell block of the README and ``docs/usage.md`` runs as written, in order.

Each document's blocks (``helpers/doc_blocks.py`` finds them) run as one bash script in a
scratch folder, so a daemon a block starts in the background is there for the next block
(the README's walk: ``serve ... &``, then the trainers, ``memory``, ``kill %1``). What the
test does to a block, and only this:

- the epochs: ``PIXPOOL_MAX_EPOCHS=1`` in the environment (``pixpool train`` and ``demo``
  honour it), never an edited ``--epochs``;
- the data: a block that names a dataset finds the synthetic set at that path in the scratch
  folder: ``data.yaml`` (16 images) and ``coco/annotations/instances_train2017.json`` with
  ``coco/images/train2017`` (its COCO json and images); the walk writes its own;
- the default socket directory: ``XDG_RUNTIME_DIR`` points into the scratch folder, so the
  blocks without ``--socket-dir`` meet there, away from any daemon of the machine's;
- system paths a test may not write (``/run/pixpool``) are folders of the scratch folder;
- ``pip install ... &&`` is dropped in front of a command (the test runs in the environment
  those installs made; installing needs the network);
- a daemon started in the foreground (``pixpool serve`` without ``&``) runs until it serves
  and is then stopped with SIGINT, as Ctrl-C stops it, and must exit 0;
- before a block that starts a daemon, the daemons and trainers earlier blocks left running
  in the background are stopped (SIGTERM), since one socket directory serves one daemon; at
  the end of a document too.

Every ``pixpool`` command, in the foreground or the background, must exit 0 (a stand-in
``pixpool`` on PATH records any other status). ``synopsis`` blocks (usage notation:
``[--json]``, ``a|b``, ``DATA``, ``...``) are not command lines to paste: each of their
``pixpool`` lines is parsed by the command's own parser instead. Output blocks are what a
command printed. Skipped, with the reason: ``SKIPPED`` below, blocks that only install
packages, and (without a CUDA device) blocks that train with ``--device cuda``.

About 3-4 minutes on 2 shared cores (``slow``).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from helpers.commands import parse_pixpool
from helpers.doc_blocks import Block, shell_blocks, synopsis_argvs
from pixpool.shared.transport.store import DEFAULT

REPO = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "docs/usage.md")
DOC_TIMEOUT_S = 900

# Blocks not run, by their first line, and why: each needs what CI lacks.
SKIPPED = {
    'pip install torch==2.13.0 && pip install ".[test]" && cd tests && python -m pytest -q': (
        "runs this test suite itself (and installs packages: the network)"
    ),
    'pip install torch==2.14.1 torchvision==0.29.1 && pip install ".[ultralytics]"   # the pairs: [install](#install)': (
        "Ultralytics downloads coco128 and its models' fonts (the network), and the block installs the extra"
    ),
}
# What output blocks are the output of (their first words), so that no command block is taken for one.
OUTPUTS = {"snapshot retained": "pixpool memory --socket-dir walk/sock"}
SYSTEM_PATHS = ("/run/pixpool",)

_PRELUDE = r"""
set -e -m
__stop_jobs() {
    local p
    for p in $(jobs -p); do kill -TERM -- "-$p" 2>/dev/null || true; done
    wait || true
}
__until_serving() {  # a daemon in the foreground: until it serves, then Ctrl-C
    local log="__serve.$RANDOM.log" pid
    "$@" >"$log" 2>&1 &
    pid=$!
    until grep -q ' serving ' "$log"; do
        if ! kill -0 "$pid" 2>/dev/null; then cat "$log"; wait "$pid"; return 1; fi
        sleep 0.2
    done
    kill -INT -- "-$pid"  # its process group (set -m): the command, not only the shell running it
    wait "$pid"
    rm -f "$log"
}
trap __stop_jobs EXIT
"""


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def _skip_reason(block: Block) -> str | None:
    if block.first_line in SKIPPED:
        return SKIPPED[block.first_line]
    commands = [c for c in re.split(r"\s*&&\s*|\n", block.text) if c.strip()]
    if all(c.split()[0] == "pip" for c in commands):
        return "only installs packages (the network); the test runs in the environment they made"
    if "--device cuda" in block.text and not _cuda():
        return "trains on a CUDA device, and this machine has none"
    return None


def _mapped(block: Block, scratch: Path) -> str:
    """The block's text as the script runs it (module docstring)."""
    lines = []
    for line in block.text.splitlines():
        line = re.sub(r"^(?:pip install [^&]*&&\s*)+", "", line)
        for path in SYSTEM_PATHS:
            line = line.replace(path, str(scratch / path.lstrip("/")))
        command = line.split(" #", 1)[0].rstrip()
        if command.startswith("pixpool serve ") and not command.endswith("&"):
            line = f"__until_serving {command}"
        lines.append(line)
    return "\n".join(lines)


def _starts_a_daemon(text: str) -> bool:
    return any(line.startswith(("pixpool serve ", "__until_serving pixpool serve ")) for line in text.splitlines())


def _script(blocks: list[Block], scratch: Path) -> tuple[str, list[str]]:
    parts, skipped = [_PRELUDE], []
    for block in blocks:
        if block.kind != "run":
            continue
        why = _skip_reason(block)
        if why is not None:
            skipped.append(f"{block.where()}: {why}")
            continue
        text = _mapped(block, scratch)
        if _starts_a_daemon(text):
            parts.append("__stop_jobs")
        parts.append(f'echo "### {block.where()} at $SECONDS s"\n{text}')
    return "\n".join(parts) + "\n", skipped


def _scratch_data(scratch: Path) -> None:
    from pixpool.server.synthetic import write_synthetic

    data = write_synthetic(scratch, num_images=16, seed=0)
    coco = scratch / "coco"
    (coco / "annotations").mkdir(parents=True)
    shutil.copy(data.coco_json, coco / "annotations" / "instances_train2017.json")
    shutil.copytree(data.images_dir, coco / "images" / "train2017")


def _shim(scratch: Path) -> Path:
    """``pixpool`` on PATH: the installed command, recording any exit status but 0."""
    bin_dir = scratch / ".bin"
    bin_dir.mkdir()
    shim = bin_dir / "pixpool"
    shim.write_text(
        "#!/bin/bash\n"
        f'{shlex.quote(sys.executable)} -m pixpool.cli "$@"\n'
        "rc=$?\n"
        'if [ "$rc" -ne 0 ]; then echo "exit $rc: pixpool $*" >>"$DOC_FAILURES"; fi\n'
        'exit "$rc"\n'
    )
    shim.chmod(0o755)
    return bin_dir


def _remove_new_unheld(before: set[str]) -> None:
    """The snapshots the blocks kept on purpose (``prepare``, ``--keep-snapshot``), nobody's now."""
    from pixpool.shared.transport.holds import holds_of
    from pixpool.shared.transport.shm import unlink_segment

    for name in set(DEFAULT.segments()) - before:
        held = holds_of(name)
        if held is not None and not held.in_use:
            unlink_segment(name)


def test_every_block_is_classified():
    """A new command block is never taken for output, nor skipped by a stale entry."""
    blocks = [b for doc in DOCS for b in shell_blocks(REPO / doc, REPO)]
    outputs = [b for b in blocks if b.kind == "output"]
    assert all(any(b.text.startswith(o) for o in OUTPUTS) for b in outputs), [b.where() for b in outputs]
    firsts = {b.first_line for b in blocks}
    assert set(SKIPPED) <= firsts, set(SKIPPED) - firsts
    assert sum(b.kind == "run" for b in blocks) >= 10


def test_synopsis_lines_parse():
    """Each ``pixpool`` line of a usage-notation block is accepted by the command's own parser."""
    checked = 0
    for doc in DOCS:
        for block in shell_blocks(REPO / doc, REPO):
            if block.kind != "synopsis":
                continue
            for argv in synopsis_argvs(block):
                try:
                    parse_pixpool(argv)
                except Exception as exc:  # BadCommand, or SystemExit from --help-like flags
                    raise AssertionError(f"{block.where()}: {shlex.join(argv)}: {exc}") from None
                checked += 1
    assert checked >= 30


@pytest.mark.slow
# The README's walk trains two trainers as written: about 4 minutes on a quiet 2-core machine,
# twice that under load, past the suite's per-test limit.
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("doc", DOCS)
def test_shell_blocks_run_as_written(doc):
    before = set(DEFAULT.segments())
    scratch = Path(tempfile.mkdtemp(prefix="pxdoc-", dir="/tmp"))  # short: ipc paths are limited to ~107 bytes
    try:
        _scratch_data(scratch)
        (scratch / "xdg").mkdir(mode=0o700)
        failures = scratch / ".failures"
        script, skipped = _script(shell_blocks(REPO / doc, REPO), scratch)
        (scratch / ".blocks.sh").write_text(script)
        env = {
            **os.environ,
            "PATH": f"{_shim(scratch)}:{os.environ['PATH']}",
            "XDG_RUNTIME_DIR": str(scratch / "xdg"),
            "PIXPOOL_MAX_EPOCHS": "1",
            "DOC_FAILURES": str(failures),
        }
        proc = subprocess.Popen(
            ["bash", str(scratch / ".blocks.sh")],
            cwd=scratch,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=DOC_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate(60)
            raise AssertionError(f"{doc}: the blocks did not finish within {DOC_TIMEOUT_S} s:\n{out[-6000:]}") from None
        recorded = failures.read_text() if failures.exists() else ""
        print(f"{doc}: skipped {skipped}; blocks began at: {re.findall(r'### (.*)', out)}")
        assert proc.returncode == 0 and not recorded, f"{doc}: {recorded}\n{out[-8000:]}"
    finally:
        _remove_new_unheld(before)
        shutil.rmtree(scratch, ignore_errors=True)
