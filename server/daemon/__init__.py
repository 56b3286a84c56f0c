"""The producer daemon: sockets and admission, trainer sessions, worker supervision, the
scheduler, and the loop that ties them together.

Runs in the daemon process; ``worker`` runs in its spawned augmentation workers. Modules:
``run`` (``run_daemon``: preflight, snapshot, serve, release), ``service`` (``Daemon``:
the loop), ``admission`` (sockets, keys, what an attach gets), ``sessions`` (trainers and
their rings), ``supervisor`` (worker processes), ``worker`` (a worker's own loop),
``scheduler`` (jobs, slots, order), ``delivery`` (how a batch reaches its trainer),
``renderer`` (the route behind one module name), ``status`` (the ``status`` reply).

Names are imported on first use: a spawned worker imports ``worker`` and pays only for it.
"""

from importlib import import_module

__all__ = ["Daemon", "run_daemon", "stop_process", "preflight"]

_WHERE = {"Daemon": "service", "run_daemon": "run", "stop_process": "run", "preflight": "admission"}


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
