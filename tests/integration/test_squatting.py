"""A name another user takes first costs the victim at most a fresh name, never its service.

Integration tests, run as root with a second Unix user (``other_user``: skipped where the run
is not root). The stranger creates, under the victim's names, what sticky shared directories
let nobody but its maker (or root) remove: an empty file under the victim's snapshot ``-meta``
name in /dev/shm, and the default socket directory ``<tmp>/pixpool-<uid>``. The victim's
``pixpool serve`` runs as a child process with those defaults, a trainer attaches, and the
stranger's things stay as they were and are reported by name and owner.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from helpers.daemon import WAIT_S, ask_status, short_socket_dir, wait_for
from helpers.snapshot import remove_snapshot
from helpers.users import as_user
from pixpool.cli import main
from pixpool.client import Client
from pixpool.client.options import ClientOptions
from pixpool.server.readers import load_dataset
from pixpool.server.snapshot.fingerprint import base_name, candidate_bases, fingerprint
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
from pixpool.shared.transport.names import snapshot_parts
from pixpool.shared.transport.store import DEFAULT

IMGSZ = 96  # the snapshot's name follows from it: fixed, so the stranger can compute it
PIXPOOL = str(Path(sys.executable).with_name("pixpool"))


def _create_empty(path: str) -> None:
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))


def _serve(data, log_path: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    argv = [PIXPOOL, "serve", str(data), "--imgsz", str(IMGSZ), "--workers", "1", "--processes", "1", *extra]
    with log_path.open("w") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)


def _stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(WAIT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(WAIT_S)
    return proc.returncode


def _status(proc: subprocess.Popen, log_path: Path, ask) -> dict:
    """The daemon's first status reply; fails with the end of its log where it exits first."""
    st = wait_for(lambda: proc.poll() is not None or ask(), WAIT_S, "the daemon's status")
    if proc.poll() is not None:
        pytest.fail(f"pixpool serve exited {proc.returncode}:\n{log_path.read_text()[-3000:]}")
    return st


def _one_batch(socket_dir: str | None) -> None:
    settings = StreamSettings(seed=0, batch_size=4, augment=AugmentConfig(imgsz=IMGSZ))
    with Client.connect(settings, ClientOptions(socket_dir=socket_dir, timeout_s=WAIT_S, as_torch=False)) as client:
        batch = next(client.epoch(0))
        assert batch.images.shape[0] == 4


def test_a_strangers_file_under_the_meta_name_costs_the_victim_only_a_fresh_name(
    other_user, synthetic_data, tmp_path, capsys
):
    """An empty file of another user under the victim's ``-meta`` name: ``pixpool serve``
    (first start, then a restart that re-attaches) serves under the next name, a trainer
    attaches, and the file stays the stranger's, untouched, named in the log and by ``ls``."""
    fp = fingerprint(load_dataset(synthetic_data.coco_json), imgsz=IMGSZ)
    meta_name = snapshot_parts(base_name(fp))["meta"]
    planted = DEFAULT.path(meta_name)
    as_user(other_user, _create_empty, planted)
    socket_dir = short_socket_dir()
    taken = None
    try:
        for start in ("first start", "restart"):
            log_path = tmp_path / f"serve-{start.replace(' ', '-')}.log"
            proc = _serve(synthetic_data.coco_json, log_path, "--socket-dir", socket_dir, "--keep-snapshot")
            try:
                st = _status(proc, log_path, lambda: ask_status(socket_dir, 1.0))
                name = st["snapshot"]["name"]
                assert name != base_name(fp) and name in candidate_bases(fp), name
                if taken is None:
                    taken = name
                else:  # the restart finds its snapshot under the name it took
                    assert name == taken and st["snapshot"]["reused"] is True
                _one_batch(socket_dir)
            finally:
                code = _stop(proc)
            text = log_path.read_text()
            assert code == 0, text[-3000:]
            assert planted in text and f"uid {other_user.uid} ({other_user.name})" in text, text[-3000:]
        st = os.lstat(planted)
        assert st.st_uid == other_user.uid and st.st_size == 0  # untouched
        capsys.readouterr()
        assert main(["ls"]) == 0
        assert f"ignored {meta_name}: " in capsys.readouterr().err
    finally:
        if taken is not None:
            remove_snapshot(taken)
        os.unlink(planted)
        shutil.rmtree(socket_dir, ignore_errors=True)


def test_a_strangers_default_socket_directory_leaves_serve_and_train_working(
    other_user, synthetic_data, tmp_path, monkeypatch
):
    """Without XDG_RUNTIME_DIR the default socket directory is ``<tmp>/pixpool-<uid>``; another
    user made it first. The victim's ``pixpool serve`` and its trainer, both at the default,
    still meet; the stranger's directory stays as it was, and the log names it and its owner."""
    tmp = tempfile.mkdtemp(prefix="pxsq-tmp-", dir="/tmp")
    os.chmod(tmp, 0o1777)  # as /tmp: everyone may create, nobody may remove another's entry
    home = tempfile.mkdtemp(prefix="pxsq-home-", dir="/tmp")
    squatted = os.path.join(tmp, f"pixpool-{os.getuid()}")
    as_user(other_user, os.mkdir, squatted, 0o755)
    monkeypatch.setenv("TMPDIR", tmp)
    monkeypatch.setenv("HOME", home)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    assert tempfile.gettempdir() == tmp
    log_path = tmp_path / "serve.log"
    proc = _serve(synthetic_data.coco_json, log_path, env=dict(os.environ))
    try:
        from pixpool.ops.status_client import query_status
        from pixpool.shared.errors import DaemonTimeout

        def ask():
            try:
                return query_status(None, timeout_s=1.0)
            except DaemonTimeout:
                return None

        _status(proc, log_path, ask)
        _one_batch(None)
    finally:
        code = _stop(proc)
        st = os.lstat(squatted)
        left = os.listdir(squatted)
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)
    text = log_path.read_text()
    assert code == 0, text[-3000:]
    assert st.st_uid == other_user.uid and left == []  # left as it was
    assert squatted in text and f"uid {other_user.uid}" in text, text[-3000:]
