"""How pixpool starts Python child processes: never with the working directory on ``sys.path``.

Runs in every process that starts another: the CLI commands that start a daemon or a
``synth`` for the user (``digest``, ``demo``, ``yolo train``), the daemon starting its
augmentation workers, ``prepare`` starting its decoders, ``demo`` starting its trainers.

Python puts the working directory first on ``sys.path`` for ``python -m`` and ``python -c``
(the way multiprocessing's spawn method starts a child), so a ``pixpool/`` folder there (an
unpacked dataset archive, a shared project folder, /tmp) would be imported by the child and
run as the user, and a source checkout named ``pixpool`` would shadow the installed code.
Two rules keep it off:

- a command line pixpool runs is ``python -P -m ...`` (``python_argv``): safe-path mode
  (Python >= 3.11) drops only that first entry, so a virtual environment, ``PYTHONPATH``
  and site-packages work as before (``-I`` would also drop ``PYTHONPATH``);
- a spawned child (``spawn_context``) starts with ``PYTHONSAFEPATH=1`` in its environment
  unless this process already runs in safe-path mode (multiprocessing then passes ``-P`` on
  by itself, ``subprocess._args_from_interpreter_flags``). Until its bootstrap replaces
  ``sys.path`` with this process's copy, a spawned child would otherwise import the
  multiprocessing modules from the working directory first. The variable is set only
  around each start, under a lock, so this process's own environment is left as it was.

The child's later ``sys.path`` is this process's (multiprocessing copies it over): a
process started by ``pixpool`` (console script, ``-P``) has no working directory on it.
"""

from __future__ import annotations

import multiprocessing.context
import os
import sys
import threading
from contextlib import contextmanager
from multiprocessing import resource_tracker
from typing import Iterator

__all__ = ["python_argv", "spawn_context", "safe_path_environment"]

_ENV = "PYTHONSAFEPATH"
_env_lock = threading.Lock()


def python_argv(module: str, *args: str) -> list[str]:
    """argv that runs ``python -m MODULE ARGS`` with this interpreter (no PATH lookup), in safe-path mode."""
    return [sys.executable, "-P", "-m", module, *args]


@contextmanager
def safe_path_environment() -> Iterator[None]:
    """While inside, a Python child started from this process does not put its working
    directory (or script folder) on ``sys.path``. Serialised: one start at a time."""
    with _env_lock:
        previous = os.environ.get(_ENV)
        if previous:  # already set by the user: nothing to add or restore
            yield
            return
        os.environ[_ENV] = "1"
        try:
            yield
        finally:
            if previous is None:
                del os.environ[_ENV]
            else:
                os.environ[_ENV] = previous


class SafePathProcess(multiprocessing.context.SpawnProcess):
    """A spawned process whose interpreter starts in safe-path mode (module docstring)."""

    def start(self) -> None:
        if sys.flags.safe_path:  # multiprocessing passes -P on itself
            super().start()
            return
        with safe_path_environment():
            super().start()


class SafePathSpawnContext(multiprocessing.context.SpawnContext):
    """multiprocessing's spawn context, its processes ``SafePathProcess``es (also those a
    ``ProcessPoolExecutor(mp_context=...)`` starts: it calls ``mp_context.Process``)."""

    Process = SafePathProcess


_CONTEXT = SafePathSpawnContext()


def spawn_context() -> SafePathSpawnContext:
    """The context every process pixpool spawns is started from.

    Also starts multiprocessing's resource tracker (a ``python -c`` child too) in safe-path
    mode now: the context's first ``Queue`` or ``Lock`` would otherwise start it, before
    any ``Process.start``, with the working directory first on its ``sys.path``.
    """
    if not sys.flags.safe_path:
        with safe_path_environment():
            resource_tracker.ensure_running()
    return _CONTEXT
