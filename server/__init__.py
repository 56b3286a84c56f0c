"""The producer side: readers, snapshot preparation, the augmentation engine, the daemon.

Sub-packages follow the data path: ``readers`` (COCO, YOLO -> records), ``snapshot``
(decode once into shared memory), ``augment`` (the training route over any image source),
``daemon`` (sockets, sessions, workers, scheduler), ``commands`` (the producer's CLI
sub-commands). It imports ``pixpool.shared``, never ``pixpool.client``.

Names are imported on first use, so ``pixpool --help`` and the workers pay only for what
they touch.
"""

from ..shared._lazy import lazy_exports

_WHERE = {
    "load_dataset": "readers",
    "write_synthetic": "synthetic",
    "prepare_snapshot": "snapshot.prepare",
    "Snapshot": "snapshot.handle",
    "list_snapshots": "snapshot.handle",
    "ReferenceSource": "snapshot.reference",
    "render_batch": "augment.batch",
    "run_daemon": "daemon.run",
    "stop_process": "daemon.run",
    "preflight": "daemon.preflight",
    "Daemon": "daemon.service",
}

__all__, __getattr__ = lazy_exports(__name__, (), _WHERE)
