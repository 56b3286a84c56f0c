"""A producer daemon as a child process, started through the ``pixpool`` CLI.

Runs in the operator's process (``pixpool demo``, ``pixpool digest`` without
``--socket-dir``). The trainer side never imports the producer's code: it runs
``pixpool serve`` (``python -P -m pixpool.cli serve ...``) like a user would, waits
until the daemon answers a status request, and on the way out stops it with SIGTERM (its
clean shutdown removes its rings and the snapshot it created), escalating to SIGKILL
after ``stop_timeout_s``; the child is always reaped.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from contextlib import contextmanager
from typing import Iterator

from ..shared.errors import DaemonStopped, DaemonTimeout
from ..shared.transport import endpoint as ep
from ..shared.transport.control import request_status
from ..shared.transport.spawn import python_argv
from ..shared.wire.status import Status

_POLL_S = 0.1


def cli_command(*args: str) -> list[str]:
    """argv that runs ``pixpool ARGS`` with this interpreter (no PATH lookup), never with the
    working directory on ``sys.path`` (``shared.transport.spawn``)."""
    return python_argv("pixpool.cli", *args)


@contextmanager
def serve_child(
    serve_args: list[str],
    *,
    socket_dir: str | None = None,
    timeout_s: float = 300.0,
    stop_timeout_s: float = 60.0,
    log_file: str | os.PathLike | None = None,
) -> Iterator[tuple[subprocess.Popen, str, Status]]:
    """Run ``pixpool serve SERVE_ARGS --socket-dir DIR``; yield (process, DIR, first status).

    Without ``socket_dir`` a private temporary directory is used and removed afterwards.
    ``log_file``: the daemon logs there (``serve --log-file``) and shows only warnings and
    errors on this process's console, where the command that started it prints its own lines.
    """
    own_dir = socket_dir is None
    sdir = tempfile.mkdtemp(prefix="pxsv-") if own_dir else str(socket_dir)
    # Its own process group: Ctrl-C in a terminal signals the whole foreground group, and a
    # daemon that stopped on it at once would fail its trainer mid-batch ("daemon stopped")
    # before the trainer's own KeyboardInterrupt. The parent stops it on the way out instead.
    log_args = ["--log-file", os.fspath(log_file)] if log_file is not None else []
    proc = subprocess.Popen(cli_command("serve", *serve_args, "--socket-dir", sdir, *log_args), process_group=0)
    try:
        status = wait_serving(proc, sdir, timeout_s=timeout_s, what=" ".join(serve_args[:1]))
        yield proc, sdir, status
    finally:
        stop_child(proc, timeout_s=stop_timeout_s)
        if own_dir:
            shutil.rmtree(sdir, ignore_errors=True)


def wait_serving(proc: subprocess.Popen, socket_dir: str, *, timeout_s: float, what: str = "") -> Status:
    """The daemon's first status reply, once it answers; DaemonStopped if it exits first."""
    endpoint = ep.ipc_endpoint(socket_dir)
    deadline = time.monotonic() + timeout_s
    while True:
        code = proc.poll()
        if code is not None:
            raise DaemonStopped(f"`pixpool serve {what}` exited with code {code} before serving; its error is above")
        if os.path.exists(ep.socket_path(socket_dir)):
            status = request_status(endpoint, timeout_s=_POLL_S * 5)
            if status is not None:
                return Status.from_wire(status)
        if time.monotonic() > deadline:
            raise DaemonTimeout(f"`pixpool serve {what}` did not start serving within {timeout_s} s")
        time.sleep(_POLL_S)  # polling interval of a bounded wait for start-up


def stop_child(proc: subprocess.Popen, *, timeout_s: float = 60.0) -> int | None:
    """SIGTERM, wait, then SIGKILL; always reaps. The exit code (negative: killed by signal)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10.0)
    return proc.returncode
