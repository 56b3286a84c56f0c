"""The training loader Ultralytics' trainer iterates: a pixpool ``attach()`` stream in its shape.

The batches are those of the task the daemon serves (``task``, ``kpt_shape`` from the
stream): boxes, and masks, keypoints or angles (``batches.py``).

Runs in the trainer process (each DDP rank its own); imports neither Ultralytics nor the
producer. ``BaseTrainer`` reads these attributes of its ``train_loader``: ``len()``,
iteration (batch dicts, ``batches.py``), ``batch_size``, ``drop_last``, ``num_workers``,
``sampler`` (``len`` and, under DDP, ``set_epoch``), ``dataset`` (``len``, ``labels`` for
``max_det``, class weights and label plots; ``close_mosaic``), ``reset()`` and ``close()``.

Epochs: the trainer's ``on_train_epoch_start`` callback pins the epoch with ``set_epoch``
(``trainer.py``), so a repeated epoch (Ultralytics' OOM or NaN recovery) replays the same
batches instead of moving on. ``close_mosaic`` needs nothing at run time: the stream was
attached with ``epochs`` and ``close_mosaic``, and the daemon renders the closed epochs
without mosaic, copy-paste, mixup and cutmix, on the epoch Ultralytics closes its own
(``epoch >= epochs - close_mosaic``, the same rule).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from ...client.loader import Loader
from ...shared.stream.sampler import epoch_indices
from ...shared.task import WithSpec
from .batches import ShapeCache, StreamFormat

log = logging.getLogger(__name__)


class _Sampler:
    """What Ultralytics asks of ``train_loader.sampler``: this rank's sample count, ``set_epoch``."""

    def __init__(self, owner: TrainLoader):
        self._owner = owner

    def __len__(self) -> int:
        loader = self._owner.stream
        return len(epoch_indices(loader.client.num_records, loader.settings, loader.epoch))

    def set_epoch(self, epoch: int) -> None:
        self._owner.set_epoch(epoch)


class _Dataset:
    """What Ultralytics asks of ``train_loader.dataset``: its length, its labels, ``close_mosaic``.

    ``labels`` come from ``labels_source()`` (Ultralytics' own label reader over the same
    images, no pixels), built on first use."""

    def __init__(self, owner: TrainLoader, labels_source: Callable[[], list] | None):
        self._owner = owner
        self._labels_source = labels_source
        self._labels: list | None = None

    def __len__(self) -> int:
        return self._owner.stream.client.num_records

    @property
    def labels(self) -> list:
        if self._labels is None:
            self._labels = list(self._labels_source()) if self._labels_source is not None else []
        return self._labels

    def close_mosaic(self, hyp: Any = None) -> None:
        cfg = self._owner.stream.settings.augment
        log.info(
            "pixpool: epoch %d renders without mosaic, copy-paste, mixup and cutmix (close_mosaic=%d of epochs=%d, set when the stream attached)",
            self._owner.stream.epoch,
            cfg.close_mosaic,
            cfg.epochs,
        )


class TrainLoader(WithSpec):
    """A pixpool stream (``pixpool.client.loader.Loader``) as Ultralytics' ``train_loader``."""

    def __init__(
        self,
        stream: Loader,
        *,
        num_workers: int = 0,
        single_cls: bool = False,
        classes: tuple[int, ...] | None = None,
        labels_source: Callable[[], list] | None = None,
    ):
        self.stream = stream
        self.batch_size = stream.settings.batch_size
        self.drop_last = stream.settings.drop_last
        self.num_workers = num_workers  # the daemon's workers (Ultralytics logs it)
        self.single_cls = single_cls
        self.classes = classes  # Ultralytics' classes=: the rows of other classes are dropped
        self.sampler = _Sampler(self)
        self.dataset = _Dataset(self, labels_source)
        self._shapes = ShapeCache()
        # What the daemon serves (the ``attached`` reply).
        self.spec = stream.spec

    @property
    def names(self) -> list[str]:
        return self.stream.names

    def set_epoch(self, epoch: int) -> None:
        self.stream.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.stream)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        imgsz = self.stream.settings.augment.imgsz
        form = StreamFormat(imgsz, self.spec, self.single_cls, self.classes, self._shapes)
        for batch in self.stream:
            yield form(batch.images, batch.targets, batch.files, getattr(batch, "masks", None))

    def reset(self) -> None:
        """Ultralytics rebuilds its workers' transforms here; pixpool's stream needs nothing."""

    def close(self) -> None:
        self.stream.close()
