"""The validation loader Ultralytics' validator iterates: the daemon's val split, as its own loader gives it.

Runs in the trainer process (each DDP rank its own); imports neither Ultralytics nor the
producer. The daemon renders Ultralytics' rect validation batches (``rect_stride``:
``server/augment/val_rect.py``, planned by ``shared/stream/rect_plan.py``): sorted by aspect
ratio, each batch letterboxed into its own shape (stride from the model, pad 0.5), images
byte for byte those of Ultralytics' ``YOLODataset(rect=True)`` + ``LetterBox(scaleup=False)``
+ ``Format``; under DDP each rank takes the contiguous run of whole batches Ultralytics 8.4's
``ContiguousDistributedSampler`` gives it. ``client/rect_view.py`` cuts each batch's (H, W)
out of its slot squares; ``batches.to_ultralytics`` makes the dict, and the validation
geometry is set here: ``ratio_pad`` ``((gain_h, gain_w), (left, top))`` and ``resized_shape``
the batch shape, as ``LetterBox`` leaves them.

What the validator and trainer read of a loader: ``len()``, iteration, ``batch_size``,
``num_workers``, ``dataset`` (``len``, ``im_files``, ``labels``) and ``close()``. The stream is
attached only while it is read (``open_stream`` per pass), so a run holds no validation ring
between validations; every pass is epoch 0 of the stream (the same batches each time). As the
training stream does across a daemon restart, each pass waits for a restarting daemon (up to
``timeout_s``) and stays on the snapshot the first one read (``client/pass_stream.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ...client.options import ClientOptions
from ...client.pass_stream import PassStreams
from ...client.rect_view import RectView
from ...shared.stream.sampler import num_batches
from ...shared.task import WithSpec
from .batches import ShapeCache, StreamFormat

log = logging.getLogger(__name__)


class _Dataset:
    """What Ultralytics asks of ``dataloader.dataset``: its length, its files, its labels."""

    def __init__(self, owner: ValLoader, labels_source: Callable[[], list] | None):
        self._owner = owner
        self._labels_source = labels_source
        self._labels: list | None = None

    def __len__(self) -> int:
        return self._owner.num_records

    @property
    def im_files(self) -> list[str]:
        return list(self._owner.files)

    @property
    def labels(self) -> list:
        if self._labels is None:
            self._labels = list(self._labels_source()) if self._labels_source is not None else []
        return self._labels


class ValLoader(WithSpec):
    """The daemon's val split as Ultralytics' validation ``dataloader``.

    ``open_stream(wait_s)`` attaches a ``Loader`` with ``split="val"``, ``rect_stride`` and this
    rank's shard, waiting ``wait_s`` for a daemon that is not listening; it is called once here
    (to learn the split) and once per pass (``PassStreams``: a later pass waits up to
    ``restart_wait_s`` for a restarting daemon and must find the first one's snapshot)."""

    def __init__(
        self,
        open_stream: Callable[[float], Any],
        *,
        restart_wait_s: float = 0.0,
        num_workers: int = 0,
        single_cls: bool = False,
        classes: tuple[int, ...] | None = None,
        labels_source: Callable[[], list] | None = None,
        check: Callable[[Any], None] | None = None,
    ):
        self._passes = PassStreams(open_stream, ClientOptions(timeout_s=restart_wait_s))
        self.num_workers = num_workers
        self.single_cls = single_cls
        self.classes = classes
        self._shapes = ShapeCache()
        stream = self._passes.open()
        try:
            if check is not None:
                check(stream)
            self.settings = stream.settings
            self.num_records = stream.client.num_records
            files = stream.client.files
            self.files = [files[i] for i in range(len(files))]
            self.spec = stream.spec
            self.names = list(stream.names)
        finally:
            stream.close()
        self.batch_size = self.settings.batch_size
        self.dataset = _Dataset(self, labels_source)

    def __len__(self) -> int:
        return num_batches(self.num_records, self.settings, 0)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        stream = self._passes.open()
        try:
            stream.set_epoch(0)
            view = RectView(stream, shape_of=self._shapes)
            imgsz = self.settings.augment.imgsz
            form = StreamFormat(imgsz, self.spec, self.single_cls, self.classes, self._shapes)
            for batch in stream:
                images, masks, shape = view.crop(batch)
                yield letterboxed(form(images, batch.targets, batch.files, masks), shape)
        finally:
            stream.close()

    def reset(self) -> None:
        """Ultralytics rebuilds its workers here; the daemon's stream needs nothing."""

    def close(self) -> None:
        """Nothing is held between passes (each pass attaches and detaches)."""


def letterboxed(batch: dict[str, Any], shape: tuple[int, int]) -> dict[str, Any]:
    """``batch`` with the geometry of Ultralytics' validation ``LetterBox`` into ``shape`` (H, W):
    ``ratio_pad`` ``((gain_h, gain_w), (left, top))``, the record (the long side resized to
    imgsz) centred, never scaled again; ``resized_shape`` the batch shape."""
    height, width = shape
    pads = []
    for (gain_h, gain_w), (h0, w0) in zip(batch["ratio_pad"], batch["ori_shape"]):
        h, w = round(gain_h * h0), round(gain_w * w0)  # the prepared record's size
        pads.append(((gain_h, gain_w), ((width - w) // 2, (height - h) // 2)))
    batch["ratio_pad"] = tuple(pads)
    batch["resized_shape"] = tuple(np.array([height, width]) for _ in pads)
    return batch


def val_settings(
    *, batch_size: int, imgsz: int | None, stride: int, rank: int, world_size: int, mask_ratio: int, overlap_mask: bool
):
    """The stream of Ultralytics' validation loader: the val split, in order, its rect batches
    for a model of ``stride`` (Ultralytics takes max(model stride, 32))."""
    from ...shared.stream.config import AugmentConfig, StreamSettings

    augment = AugmentConfig(
        imgsz=imgsz, train_route=False, rect_stride=stride, mask_ratio=mask_ratio, overlap_mask=overlap_mask
    )
    return StreamSettings(
        batch_size=batch_size, rank=rank, world_size=world_size, shuffle=False, split="val", augment=augment
    )


def daemon_val_loader(settings, client: ClientOptions, **options: Any) -> ValLoader:
    """A ``ValLoader`` over the daemon ``client`` names (its ``socket_dir``, ``timeout_s``, and
    ``expect``, the data it must serve as its val split: ``served_data``); ``options`` as
    ``ValLoader`` takes them. A daemon serving no val split is a ConfigError naming the field
    ``split``."""
    from ...client.loader import Loader

    def open_stream(wait_s: float):
        # A copy per batch (zero_copy off): the validator keeps batches for its plots.
        return Loader(settings, client.replace(wait_s=wait_s, zero_copy=False))

    # A restart between passes is waited for as long as the training stream waits for one.
    return ValLoader(open_stream, restart_wait_s=client.timeout_s, **options)
