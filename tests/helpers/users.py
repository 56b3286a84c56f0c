"""A second Unix user for the multi-user tests: the attacker, or simply another operator.

Runs in the test process. ``as_user`` forks, drops to that user's uid/gid in the child and
runs a function there (file operations only: the child touches no socket), reporting its
traceback back through a pipe; ``cli_as`` runs a ``pixpool`` command line that way. The ``other_user`` fixture (conftest.py) creates the user with ``useradd``
when the tests run as root and skips otherwise.
"""

from __future__ import annotations

import io
import os
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int


def as_user(user: User, fn, *args, timeout_s: float = 30.0) -> None:
    """Run ``fn(*args)`` in a forked child as ``user``; re-raise its failure here."""
    code, out, _ = _forked(user, fn, args, timeout_s)
    if code != 0:
        raise AssertionError(f"as {user.name}: {out or 'exit status ' + str(code)}")


def cli_as(user: User, argv: list[str], *, timeout_s: float = 60.0) -> tuple[int, str, str]:
    """``pixpool ARGV`` as ``user`` in a forked child: (exit code, stdout, stderr).

    Forked rather than exec'd: the test interpreter may live where that user cannot
    reach it (a pyenv under /root), and the child needs nothing it has not imported."""
    from pixpool.cli import main

    def run() -> None:
        code = main(argv)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    code, report, captured = _forked(user, run, (), timeout_s, capture=True)
    if report:
        raise AssertionError(f"pixpool {' '.join(argv)} as {user.name} raised:\n{report}")
    return code, *captured


def _forked(user: User, fn, args, timeout_s: float, *, capture: bool = False):
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: drop privileges, run, report, never return into pytest
            os.close(read_fd)
            code = 0
            try:
                if capture:
                    sys.stdout, sys.stderr = (
                        io.TextIOWrapper(os.fdopen(os.dup(out.fileno()), "wb")),
                        io.TextIOWrapper(os.fdopen(os.dup(err.fileno()), "wb")),
                    )
                os.setgroups([])
                os.setgid(user.gid)
                os.setuid(user.uid)
                fn(*args)
            except BaseException:
                os.write(write_fd, traceback.format_exc().encode())
                code = 1
            os._exit(code)
        os.close(write_fd)
        deadline = time.monotonic() + timeout_s
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                raise TimeoutError(f"child running as {user.name} did not finish within {timeout_s} s")
            time.sleep(0.01)  # polling interval of a bounded wait for the child
        with os.fdopen(read_fd, "rb") as f:
            report = f.read().decode()
        captured = []
        for f in (out, err):
            f.seek(0)
            captured.append(f.read().decode())
    return os.waitstatus_to_exitcode(status), report, captured
