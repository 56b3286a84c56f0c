"""A daemon that serves a detect snapshot as another task's source, for the wire tests.

Runs in a spawned daemon process (``serve_as_task``, a ``daemon_process`` target) and in its
workers (``TaskSource`` unpickles there). The wire (ring layout, workers, delivery, client)
only reads a source's ``task``, ``kpt_shape`` and ``flip_idx``; with a stand-in route
(``helpers.task_renderer``) that writes the task's rows and planes, a prepared detect
snapshot can carry any task through a real daemon, without the readers of those tasks.
"""

from __future__ import annotations

from contextlib import contextmanager

from helpers.daemon import daemon_process
from pixpool.shared.stream.config import DaemonConfig
from pixpool.shared.task import task_spec


class TaskSource:
    """A snapshot (or any ImageSource) that says it holds ``task``; pickles as the snapshot's
    name plus the task, so each worker re-attaches the snapshot read-only as usual."""

    def __init__(self, source, task: str, kpt_shape=None, flip_idx=None):
        self._source = source
        self.task = task
        self.kpt_shape = None if kpt_shape is None else tuple(kpt_shape)
        self.flip_idx = None if flip_idx is None else tuple(flip_idx)
        self.spec = task_spec(task, kpt_shape=self.kpt_shape, flip_idx=self.flip_idx)

    def __len__(self) -> int:
        return len(self._source)

    def __getattr__(self, name: str):
        if name.startswith("__") or name == "_source":
            raise AttributeError(name)
        return getattr(self._source, name)

    def __reduce__(self):
        return TaskSource, (self._source, self.task, self.kpt_shape, self.flip_idx)


def serve_as_task(config: DaemonConfig, *, renderer: str, task: str, kpt_shape=None, flip_idx=None) -> None:
    """``run_daemon``'s order (preflight, prepare, serve, release) with the source as ``task``."""
    from pixpool.server.daemon.preflight import preflight
    from pixpool.server.daemon.service import Daemon
    from pixpool.server.readers import load_dataset
    from pixpool.server.snapshot.prepare import prepare_snapshot

    config = preflight(config)
    dataset = load_dataset(config.data)
    snap = prepare_snapshot(dataset, config.prepare_options()).snapshot
    try:
        source = TaskSource(snap, task, kpt_shape, flip_idx)
        Daemon(source, config, names=tuple(dataset.names), renderer=renderer).serve()
    finally:
        snap.release(keep=False)


@contextmanager
def task_daemon(
    data, *, task: str, kpt_shape=None, flip_idx=None, imgsz: int = 64, workers: int = 2, renderer: str, **extra
):
    """A daemon process serving ``data`` as ``task`` with ``renderer``; yields (process, socket dir)."""
    config = DaemonConfig(data=str(data), imgsz=imgsz, workers=workers, processes=1, no_val=True, **extra)
    options = {"task": task, "kpt_shape": kpt_shape, "flip_idx": flip_idx}
    with daemon_process(config, renderer=renderer, target=serve_as_task, target_kwargs=options) as (proc, d):
        yield proc, d
