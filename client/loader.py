"""``attach()``: the daemon's stream as a drop-in for a ``torch.utils.data.DataLoader``.

Runs in the trainer process. Code written against a DataLoader and a ``DistributedSampler``
keeps working::

    loader = pixpool.client.attach(batch_size=16, seed=0, mosaic=1.0)
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for images, targets in loader:     # uint8 (B, 3, S, S) RGB; float32 (n, 6): see attach()
            ...
    loader.close()                          # or use it as a context manager

- ``len(loader)`` is the number of batches of this rank's shard in the current epoch.
- Rank and world size default to the initialised ``torch.distributed`` group, else the
  ``RANK``/``WORLD_SIZE`` environment variables (``torchrun`` sets them), else 0/1; each rank
  gets a disjoint shard and together they cover the epoch once (``shared/stream/sampler.py``).
- ``set_epoch(e)`` chooses the epoch the next iteration delivers; without it each new
  iteration moves on to the next epoch, so shuffling and augmentation differ per epoch as
  a ``DataLoader(shuffle=True)`` user expects.
- Each batch unpacks as ``images, targets`` and carries ``indices`` (record indices),
  ``files`` (their image files), ``epoch``, ``batch`` and, on a segment dataset, ``masks``;
  it is a named tuple that trainers' collection utilities (Lightning's device transfer,
  torch's pin-memory and convert helpers) rebuild with all of that (``client/batch.py``).
  ``names``, ``num_classes``, ``task``, ``kpt_shape`` and ``flip_idx`` come from the daemon.
- ``loader.files[i]`` is record ``i``'s image file. ``attach()`` carries nothing per record
  (its cost does not grow with the set): the names are fetched from the daemon when first
  read, by ``files`` or the first batch, once per attachment (``client/record_files.py``).
  Nor does ``attach()`` import torch; the first batch does, where the script has not.
- A closed loader (``close()``, or after its ``with`` block) raises ``ClosedError`` when
  iterated or asked its ``len()``.
- A batch is the user's, as a DataLoader's is: it stays valid for as long as it is held
  (``list(loader)``, a batch kept for a plot or a later step). ``zero_copy=True`` opts into
  views of the ring slot instead, valid only until the next batch is asked for.
- If the daemon is restarted on another dataset (``SnapshotChangedError``, see
  ``client/client.py``) the loader stops, unless ``follow_snapshot=True``.
- ``attach(data="B.yaml")`` names the data to train on: a daemon that serves another
  dataset (other image files, classes, or ``task=`` when given) is refused with
  ``DatasetMismatchError`` naming both, instead of training on whatever it serves
  (``shared/stream/served_data.py``).

Owned batches: a lent slot while few are held, else a copy (``client/flow.py``). The ring
has 2-3 slots per trainer and the daemon renders into the next free one while the trainer
steps, so a slot the user holds is a slot the workers cannot use. A batch handed out is
therefore either a *lent slot* (its images tensor wraps the ring slot; the slot goes back
to the daemon once that tensor and every tensor derived from it, ``images[0]``,
``images.view(...)``, are gone) or an owned copy (its slot goes back at once). At most the
ring's slots less one are lent at a time, so the workers always keep a slot; past that,
batches are copied: ``list(loader)`` keeps its first two batches as lent slots and copies
the rest. A ``for batch in loader`` loop holds the previous batch while the next is handed
out, so it gets every batch lent: no copy per batch. The copy it saves is one memcpy of the
slot per batch in the trainer's thread: measured (``bench/memory.py --what ownership``,
docs/benchmarks.md) 6-8 ms for batch 16 at 640 against 100-380 ms of render time per batch
(2-6 %); on two cores shared by the workers and the trainer that is CPU taken from
rendering (docs/benchmarks.md, "The route"). Lending needs torch batches on the host; a device
gets its own copy, and ``zero_copy=True`` hands out slot views valid only until the next
batch, as pixpool's own loops use it, which provably drop each batch before asking for the
next (``fit.py``'s training and validation loops copy it into the step's buffers or the
device first; the Ultralytics loader's batches are moved and converted by the trainer's
``preprocess_batch`` at once).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
from typing import Any, Iterator

from ..shared.errors import ClosedError, ConfigError
from ..shared.stream import served_data
from ..shared.stream.config import AugmentConfig, StreamSettings
from ..shared.stream.sampler import num_batches
from ..shared.stream.served_data import ExpectedData
from ..shared.task import TaskSpec, WithSpec
from ..shared.text import closest
from ..shared.transport.ring import DEFAULT_SLOTS
from ._torch import check_torch
from .batch import Batch
from .client import Client
from .options import ClientOptions
from .record_files import RecordFiles


def distributed_rank() -> tuple[int, int]:
    """(rank, world_size): the initialised torch.distributed group, else RANK/WORLD_SIZE, else (0, 1)."""
    # Only a process that imported torch.distributed can have initialised its group: one that
    # did not is spared torch's import here (seconds; attach() itself takes well under one).
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    try:
        return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    except ValueError:
        raise ConfigError(
            f"RANK={os.environ.get('RANK')!r} / WORLD_SIZE={os.environ.get('WORLD_SIZE')!r} must be whole numbers"
        ) from None


class Loader(WithSpec):
    """The iterable ``attach()`` returns (see module docstring): a ``Client`` connected with
    ``options`` (a ``ClientOptions``), its batches torch tensors."""

    def __init__(self, settings: StreamSettings, options: ClientOptions):
        check_torch("pixpool.client.attach (it yields torch tensors)")
        self.zero_copy = bool(options.zero_copy)
        self.client = Client.connect(settings, options.replace(as_torch=True))
        self.epoch = settings.start_epoch
        self._pinned: int | None = None  # set_epoch's choice for the next iteration
        self._started = False

    @property
    def settings(self) -> StreamSettings:
        """The stream's settings, with the daemon's imgsz where the trainer left it to the daemon."""
        return self.client.settings

    @property
    def names(self) -> list[str]:
        return self.client.names

    @property
    def files(self) -> RecordFiles:
        """The image file of every record of the stream's split, in record order (``files[i]``
        is record ``i``'s, as a batch's ``indices`` number them): fetched from the daemon when
        first read, not at attach (``client/record_files.py``)."""
        return self.client.files

    @property
    def num_classes(self) -> int:
        return len(self.client.names)

    @property
    def spec(self) -> TaskSpec:
        """The daemon's dataset's task (``shared/task.py``), with its keypoint layout for pose;
        ``task`` (detect, segment, pose or obb), ``kpt_shape`` and ``flip_idx`` are read from it."""
        return self.client.spec

    @property
    def rank(self) -> int:
        return self.settings.rank

    @property
    def world_size(self) -> int:
        return self.settings.world_size

    def set_epoch(self, epoch: int) -> None:
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ConfigError(f"set_epoch({epoch!r}): the epoch must be a whole number >= 0")
        self._pinned = epoch
        self.epoch = epoch

    @property
    def closed(self) -> bool:
        return self.client.closed

    def _check_open(self, what: str) -> None:
        if self.client.closed:
            raise ClosedError(
                f"{what} a closed pixpool loader (attached to {self.client.endpoint}); use it before close(), "
                "inside its with block, or attach() again"
            )

    def __len__(self) -> int:
        self._check_open("len() of")
        return num_batches(self.client.num_records, self.settings, self.epoch)

    def __iter__(self) -> Iterator[Batch]:
        self._check_open("iterating over")
        return self._batches()

    def _batches(self) -> Iterator[Batch]:
        if self._pinned is not None:
            self.epoch, self._pinned = self._pinned, None
        elif self._started:
            self.epoch += 1
        self._started = True
        for b in self.client.epoch(self.epoch):
            indices = b.samples
            # Read at each batch: each attach makes a new one (a daemon that follows another
            # snapshot); the first batch of an attachment fetches the names.
            table = self.client.files.table()
            yield Batch(
                b.images,
                b.targets,
                indices=indices,
                files=[table[i] for i in indices.tolist()] if len(table) else [],  # [] where none are named
                epoch=b.epoch,
                batch=b.batch,
                masks=b.masks,
            )

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# Settings ``attach`` takes by name besides ``settings``: StreamSettings' own fields and AugmentConfig's.
_STREAM_FIELDS = frozenset(f.name for f in dataclasses.fields(StreamSettings)) - {"augment"}
_AUGMENT_FIELDS = frozenset(f.name for f in dataclasses.fields(AugmentConfig))
# Overrides whose None means "not given" (the defaults below apply).
_NONE_IS_UNSET = ("rank", "world_size", "shuffle")


def attach(
    socket_dir: str | os.PathLike | None = None,
    *,
    settings: StreamSettings | None = None,
    endpoint: str | None = None,
    keys_dir: str | os.PathLike | None = None,
    device: Any = None,
    timeout_s: float = 60.0,
    wait_s: float = 0.0,
    slots: int = DEFAULT_SLOTS,
    store: str | os.PathLike | None = None,
    zero_copy: bool = False,
    follow_snapshot: bool = False,
    data: str | os.PathLike | None = None,
    images: str | os.PathLike | None = None,
    task: str | None = None,
    **overrides: Any,
) -> Loader:
    """A DataLoader-like view of the daemon's stream (see module docstring).

    The stream is ``settings`` (a ``StreamSettings``; default: its defaults) with
    ``overrides`` applied: any field of ``StreamSettings`` (``batch_size``, ``seed``,
    ``rank``, ``world_size``, ``shuffle``, ``drop_last``, ``start_epoch``, ``hsv_on_device``,
    ``split``) or of ``AugmentConfig`` (``imgsz``, ``mosaic``, ``degrees``, ``copy_paste``,
    ``close_mosaic``, ``epochs``, ``train_route``, ...) by name, validated by those classes (an
    unknown name is a ConfigError naming it and the known ones); ``augment=`` takes a whole
    ``AugmentConfig`` too. Unless given (here or by ``settings``): ``rank``/``world_size``
    come from ``torch.distributed``, else ``RANK``/``WORLD_SIZE``, else 0/1; ``split="val"``
    streams the daemon's validation set through the validation route (``train_route=False``:
    letterboxed, no randomness) in dataset order (``shuffle=False``).

    Each batch unpacks as ``images, targets``: ``images`` uint8 (B, 3, S, S) RGB, S the
    stream's ``imgsz``; ``targets`` float32 (n, W), one row per object:
    ``(batch_index, class, cx, cy, w, h)``, ``batch_index`` the image's position in the batch
    (0..B-1), ``class`` the class id (an index into ``loader.names``), the box centre and
    size normalised by S (0..1), rows in image order; then the task's columns
    (``loader.task``; ``shared/task.py``): obb the angle in radians, pose K x (x, y,
    visibility) with x, y normalised by S. It also carries ``indices``, ``files``, ``epoch``,
    ``batch`` and, for segment, ``masks``: (B, S/mask_ratio, S/mask_ratio) uint8 (int32 where
    an image may have more than 255 instances), instance k of an image numbered k, 0 background.

    Connection options: ``endpoint`` (``tcp://HOST:PORT``, with ``keys_dir``), ``device``
    (move batches there), ``timeout_s``, ``slots`` (ring slots), ``store`` (where this process
    sees the daemon's store, where that differs from the daemon's own path: a container).
    Without a daemon at ``socket_dir`` it fails within a second (``DaemonNotFound``); a daemon
    that is starting there (preparing its snapshot) is waited for, up to 120 s or ``wait_s``
    where longer; ``wait_s`` also waits that many seconds for a daemon not started yet.
    ``zero_copy=True``: each batch is a view of its ring slot, valid only until the next batch
    is asked for (saves one copy of the batch per step; for loops that never keep a batch).
    ``follow_snapshot=True``: when the daemon comes back after a restart serving another
    snapshot (a new dataset version), warn and go on with it at the same epoch and batch
    position instead of raising ``SnapshotChangedError``.

    The data to train on: ``data`` (a data.yaml, a YOLO images folder or a COCO json, with
    ``images`` for the json's images folder; as ``pixpool serve`` takes them) and ``task``.
    Given, the daemon must serve exactly that as the stream's split (the same image files
    once paths are resolved, the data.yaml's class names, the task), else
    ``DatasetMismatchError`` names both; None (the default) takes whatever the daemon serves.
    """
    stream = stream_settings(settings, **overrides)
    options = ClientOptions(
        socket_dir=socket_dir,
        endpoint=endpoint,
        keys_dir=keys_dir,
        device=device,
        timeout_s=timeout_s,
        wait_s=wait_s,
        slots=slots,
        store=store,
        zero_copy=zero_copy,
        follow_snapshot=follow_snapshot,
        expect=expected_data(data, images, split=stream.split, task=task),
    )
    return Loader(stream, options)


def expected_data(
    data: str | os.PathLike | None, images: str | os.PathLike | None = None, *, split: str, task: str | None = None
) -> ExpectedData | None:
    """The data a trainer names (``served_data.expect``), or None where it names none."""
    if data is None:
        if images is not None or task is not None:
            given = "images=" if images is not None else "task="
            raise ConfigError(
                f"{given} describes the data named by data=; name data= too, or leave {given} out", field="data"
            )
        return None
    return served_data.expect(data, images, split=split, task=task)


def _unknown_message(unknown: list[str]) -> str:
    """One line naming the field meant for each mistyped one; the list of every field only
    where none is close (a typo is answered by its fix, not by 30 names)."""
    # attach()'s own keywords too: ``timeout=`` lands in ``overrides`` and means ``timeout_s``.
    own = {p.name for p in inspect.signature(attach).parameters.values() if p.kind is p.KEYWORD_ONLY}
    known = _STREAM_FIELDS | _AUGMENT_FIELDS | {"augment"} | own
    meant = {name: closest(name, known) for name in unknown}
    if all(meant.values()):
        return f"unknown field(s) {unknown} for attach(); did you mean {', '.join(repr(m) for m in meant.values())}?"
    return (
        f"unknown field(s) {unknown} for attach(); StreamSettings fields: {sorted(_STREAM_FIELDS)}; "
        f"AugmentConfig fields: {sorted(_AUGMENT_FIELDS)}"
    )


def stream_settings(settings: StreamSettings | None = None, /, **overrides: Any) -> StreamSettings:
    """``settings`` (default: ``StreamSettings()``) with ``overrides`` by field name, as ``attach`` takes them."""
    if settings is not None and not isinstance(settings, StreamSettings):
        raise ConfigError(f"settings must be a StreamSettings, got {type(settings).__name__}", field="settings")
    overrides = {k: v for k, v in overrides.items() if not (k in _NONE_IS_UNSET and v is None)}
    unknown = sorted(set(overrides) - _STREAM_FIELDS - _AUGMENT_FIELDS - {"augment"})
    if unknown:
        raise ConfigError(_unknown_message(unknown), field=unknown[0])
    base = settings if settings is not None else StreamSettings()
    augment = base.augment
    if "augment" in overrides:
        augment = overrides.pop("augment")
        if not isinstance(augment, AugmentConfig):
            raise ConfigError(
                f"augment= takes a whole AugmentConfig, got {type(augment).__name__}; give single fields as "
                "attach(mosaic=0.5, ...), or train_route=False for the validation route",
                field="augment",
            )
    stream = {k: v for k, v in overrides.items() if k in _STREAM_FIELDS}
    aug = {k: v for k, v in overrides.items() if k in _AUGMENT_FIELDS}
    if settings is None:
        if stream.get("split") == "val":
            aug.setdefault("train_route", False)
            stream.setdefault("shuffle", False)
        if "rank" not in stream or "world_size" not in stream:
            env_rank, env_world = distributed_rank()
            stream.setdefault("rank", env_rank)
            stream.setdefault("world_size", env_world)
    augment = AugmentConfig.from_dict({**augment.to_dict(), **aug}) if aug else augment
    return StreamSettings.from_dict({**base.to_dict(), **stream, "augment": augment})
