"""Processes in PID namespaces of their own: what a container is, as far as pids go.

Runs in the pytest process. ``unshare --pid --fork --mount-proc`` starts a command as PID 1
of a new PID namespace with its own /proc; the store (/dev/shm) and the socket directories
stay shared, as between containers that mount them. ``require_pid_namespaces`` skips a test
where that is not allowed (not root, no unshare). ``ns_daemon`` runs ``pixpool serve`` there;
``in_pid_namespace`` runs a command there and returns its result. Every wait has a timeout;
every process is killed and reaped in ``finally``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager

import psutil
import pytest

from helpers.daemon import WAIT_S, ask_status
from pixpool.shared.stream.config import DaemonConfig
from pixpool.shared.stream.flags import to_argv

UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc"]


def require_pid_namespaces() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the test starts processes in new PID namespaces (unshare --pid)")
    if shutil.which("unshare") is None:
        pytest.skip("unshare(1) is not installed")
    probe = subprocess.run([*UNSHARE, "true"], capture_output=True, text=True, timeout=30, check=False)
    if probe.returncode != 0:
        pytest.skip(f"unshare --pid is not allowed here: {probe.stderr.strip()}")


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


def in_pid_namespace(argv: list[str], timeout_s: float = WAIT_S) -> subprocess.CompletedProcess:
    """Run ``argv`` as PID 1 of a new PID namespace; its result (text output)."""
    return subprocess.run([*UNSHARE, *argv], capture_output=True, text=True, timeout=timeout_s, env=_env(), check=False)


def pixpool_in_pid_namespace(args: list[str], timeout_s: float = WAIT_S) -> subprocess.CompletedProcess:
    return in_pid_namespace([sys.executable, "-m", "pixpool.cli", *args], timeout_s)


class NsDaemon:
    """A ``pixpool serve`` that is PID 1 of its own PID namespace. ``pid`` is its pid as this
    namespace sees it (the child of ``unshare``)."""

    def __init__(self, proc: subprocess.Popen, pid: int, socket_dir: str, log):
        self.proc = proc
        self.pid = pid
        self.socket_dir = socket_dir
        self._log = log

    def signal(self, sig: int) -> None:
        # unshare ignores SIGTERM and forwards nothing: signal the daemon itself.
        os.kill(self.pid, sig)

    def wait(self, timeout_s: float = WAIT_S) -> int:
        return self.proc.wait(timeout=timeout_s)

    def output(self) -> str:
        """What it logged so far (stderr)."""
        self._log.seek(0)
        return self._log.read()


def _child_of(proc: subprocess.Popen, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"unshare exited with {proc.returncode} before starting its child")
        try:
            kids = psutil.Process(proc.pid).children()
        except psutil.NoSuchProcess:
            kids = []
        if kids:
            return kids[0].pid
        time.sleep(0.02)  # polling interval of a bounded wait
    raise TimeoutError(f"unshare (pid {proc.pid}) started no child within {timeout_s} s")


@contextmanager
def ns_daemon(data, socket_dir: str, *, imgsz: int, workers: int = 1, extra: tuple[str, ...] = (), wait: bool = True):
    """``pixpool serve data`` as PID 1 of a new PID namespace, serving ``socket_dir``; waits
    until it answers ``status`` with its workers up. Killed (SIGKILL, the whole namespace
    with it) and reaped on exit unless the test stopped it."""
    config = DaemonConfig(data=str(data), imgsz=imgsz, workers=workers, processes=1, socket_dir=socket_dir)
    argv = [*UNSHARE, sys.executable, "-m", "pixpool.cli", "serve", *to_argv(config), *extra]
    log = tempfile.TemporaryFile("w+")  # a file, not a pipe: a chatty daemon never blocks on it
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log, text=True, env=_env())
    try:
        daemon = NsDaemon(proc, _child_of(proc, WAIT_S), socket_dir, log)
        if wait:
            deadline = time.monotonic() + WAIT_S
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"the namespaced daemon exited with {proc.returncode}: {daemon.output()[-3000:]}"
                    )
                st = ask_status(socket_dir, 1.0) if os.path.exists(f"{socket_dir}/daemon.sock") else None
                if st is not None and sum(w["state"] != "starting" for w in st["workers"]) >= workers:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the namespaced daemon in {socket_dir} was not ready within {WAIT_S} s")
                time.sleep(0.05)  # polling interval of a bounded wait
        yield daemon
    finally:
        if proc.poll() is None:
            try:
                os.kill(_child_of(proc, 5.0), signal.SIGKILL)  # PID 1 dies: the kernel kills its namespace
            except (TimeoutError, RuntimeError, ProcessLookupError):
                pass
            try:
                proc.wait(timeout=WAIT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=WAIT_S)
        log.close()
