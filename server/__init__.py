"""The producer side: readers, preparation, snapshot, augmentation workers, daemon.

Names are imported on first use, so ``pixpool --help`` and the workers pay only for what
they touch.
"""

from importlib import import_module

__all__ = ["load_dataset", "write_synthetic", "prepare_snapshot", "Snapshot", "ReferenceSource", "render_batch", "run_daemon", "Daemon"]

_WHERE = {
    "load_dataset": "readers", "write_synthetic": "synthetic", "prepare_snapshot": "prepare", "Snapshot": "snapshot",
    "ReferenceSource": "reference", "render_batch": "augment.batch", "run_daemon": "run", "Daemon": "daemon",
}


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
