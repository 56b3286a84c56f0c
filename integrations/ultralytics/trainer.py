"""Ultralytics' trainers with a pixpool training stream, one per task served.

``PixpoolDetectionTrainer``, ``PixpoolSegmentationTrainer``, ``PixpoolPoseTrainer`` and
``PixpoolOBBTrainer`` (``TRAINERS`` by task) are Ultralytics' own ``DetectionTrainer``,
``SegmentationTrainer``, ``PoseTrainer`` and ``OBBTrainer`` with ``PixpoolStream`` mixed in
before them: model, loss, optimiser and validator stay Ultralytics'.

Runs in the trainer process (and, under DDP, in each rank Ultralytics spawns). This module
and ``command.py`` are the only ones that import Ultralytics (AGPL-3.0); nothing of theirs
is copied, the mixin overrides three hooks:

- ``get_dataloader(mode="train")`` attaches this rank to the daemon (``TrainLoader``) and
  checks that it serves exactly the training split Ultralytics resolved from ``data=`` (the
  same image sources: ``shared/stream/served_data.py``; a daemon serving another dataset is
  refused, naming both), its class names and the trainer's task (and for pose the dataset's
  ``kpt_shape`` and ``flip_idx``). ``get_dataloader(mode="val")`` reads the daemon's val split
  the same way (``val_loader.py``: Ultralytics' rect validation batches, this rank's share), for
  Ultralytics' own validator; a daemon serving no val split, a validation ``fraction`` below 1
  or ``classes`` on a segment run keep Ultralytics' own loader, said in one line.
- ``train()`` first makes sure a daemon answers at the socket directory: one already
  running is used as it is; otherwise one is started (``pixpool serve`` as a child
  process, ``workers`` workers, imgsz and ``--task`` of the run, its log in the run folder's
  ``pixpool-daemon.log``, only its warnings on the console) on the training and
  validation splits Ultralytics resolved from ``data=`` (for pose with its ``kpt_shape`` and ``flip_idx``), and
  stopped when training ends, also on errors and Ctrl-C (its clean shutdown removes its rings
  and its snapshot). Either way one line names the daemon (``notices.daemon_line``), and one
  says where the stream differs from Ultralytics' loader in this environment
  (``notices.albumentations_line``).
- an ``on_train_epoch_start`` callback pins the stream's epoch to the trainer's.

The socket directory and worker count travel in environment variables (``PIXPOOL_SOCKET_DIR``,
``PIXPOOL_WORKERS``) because Ultralytics' DDP launcher rebuilds the trainer in each rank
from its own arguments only; the ranks inherit the environment of the process that
started the daemon, and attach with their global rank and world size
(``torch.distributed``), each taking its shard.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from ultralytics.data import build_yolo_dataset
from ultralytics.data.utils import check_det_dataset, get_split_fraction
from ultralytics.models.yolo.detect import DetectionTrainer
from ultralytics.models.yolo.obb import OBBTrainer
from ultralytics.models.yolo.pose import PoseTrainer
from ultralytics.models.yolo.segment import SegmentationTrainer
from ultralytics.utils import DEFAULT_CFG, RANK, YAML
from ultralytics.utils.checks import check_imgsz
from ultralytics.utils.patches import override_configs
from ultralytics.utils.torch_utils import unwrap_model

from ...client.child import serve_child
from ...client.loader import Loader, distributed_rank
from ...client.options import ClientOptions
from ...shared.errors import ConfigError
from ...shared.stream.config import DaemonConfig
from ...shared.stream.flags import to_argv
from ...shared.stream.served_data import ExpectedData, expect_entries
from ...shared.stream.yolo_yaml import load_yaml
from ...shared.transport import endpoint as ep
from ...shared.transport.control import request_status
from ...shared.wire.status import Status
from . import failures, hyp, notices, val_loader
from .loader import TrainLoader

log = logging.getLogger(__name__)

SOCKET_DIR_ENV = "PIXPOOL_SOCKET_DIR"
WORKERS_ENV = "PIXPOOL_WORKERS"
TIMEOUT_ENV = "PIXPOOL_TIMEOUT_S"
# The snapshot dtype of a daemon this run starts (unset: pixpool's default, uint8, which holds a
# quarter of float32's bytes and gives the same batches: docs/kernel.md, "Inputs").
DTYPE_ENV = "PIXPOOL_DTYPE"
# Where a daemon this run starts writes its log, in the run folder: its lines would otherwise
# land on Ultralytics' progress bars; the console keeps its warnings and errors.
DAEMON_LOG = "pixpool-daemon.log"


def daemon_answers(socket_dir: str | None) -> Status | None:
    """The status of the daemon at ``socket_dir`` (the default directory when None), or None."""
    if not os.path.exists(ep.socket_path(socket_dir)):
        return None
    status = request_status(ep.ipc_endpoint(socket_dir), timeout_s=2.0)
    return None if status is None else Status.from_wire(status)


def _pin_epoch(trainer: PixpoolStream) -> None:
    loader = getattr(trainer, "train_loader", None)
    if isinstance(loader, TrainLoader):
        loader.set_epoch(trainer.epoch)


def _check_data_yaml(data: Any) -> None:
    """Read a local ``data=`` yaml within pixpool's bounds before Ultralytics reads it unbounded:
    a yaml of nested aliases or millions of values is refused naming the file and what to change,
    not expanded in memory. Names Ultralytics resolves itself (``coco8.yaml``) are left to it."""
    if isinstance(data, (str, os.PathLike)) and str(data).lower().endswith((".yaml", ".yml")) and os.path.isfile(data):
        load_yaml(Path(data))


class PixpoolStream:
    """Mixed in before one of Ultralytics' YOLO trainers: its training batches come from a pixpool daemon.

    Use the trainers below like Ultralytics' own: ``YOLO("yolo11n-seg.yaml").train(
    trainer=PixpoolSegmentationTrainer, data=..., epochs=...)``. Settings pixpool's route cannot
    honour are refused by name (``hyp.UNSUPPORTED``) before anything starts.
    """

    def __init__(self, cfg=DEFAULT_CFG, overrides: dict[str, Any] | None = None, _callbacks: dict | None = None):
        _check_data_yaml((overrides or {}).get("data"))
        try:
            super().__init__(cfg, overrides, _callbacks)
            hyp.check_supported(vars(self.args))
            hyp.augment_config(vars(self.args), data=self.data)  # ranges, before any process starts
        except BaseException:
            # Ultralytics made the run folder before reading data= (and before these checks).
            failures.remove_unused_run(getattr(self, "save_dir", None))
            raise
        self.pixpool_socket_dir = os.environ.get(SOCKET_DIR_ENV) or None
        self.pixpool_timeout_s = float(os.environ.get(TIMEOUT_ENV, "120"))
        self.pixpool_status: Status | None = None
        self.pixpool_daemon_log: Path | None = None  # the log of the daemon this run started, if it did
        # A running daemon's imgsz is the run's unless the user asked for one (Ultralytics'
        # default 640 is not a request: against a daemon at 320 it would only be refused).
        self.pixpool_imgsz_given = "imgsz" in (overrides or {})
        self.add_callback("on_train_epoch_start", _pin_epoch)

    # -- the daemon ---------------------------------------------------------------------
    def train(self):
        try:
            with self._daemon():
                if RANK in (-1, 0) and (line := notices.albumentations_line()):
                    log.warning(line)
                return super().train()
        except BaseException:
            failures.remove_unused_run(self.save_dir)  # refused before the first epoch: no folder left
            raise

    @contextmanager
    def _daemon(self) -> Iterator[None]:
        status = daemon_answers(self.pixpool_socket_dir)
        if status is not None:
            self.pixpool_status = status
            self._take_served_imgsz(status)
            if RANK in (-1, 0):  # the ranks of a DDP run use the one their launcher named
                log.info(notices.daemon_line(status, socket=ep.socket_path(self.pixpool_socket_dir), started=False))
            yield
            return
        if RANK not in (-1, 0):
            raise ConfigError(
                f"no pixpool daemon answers at {ep.socket_path(self.pixpool_socket_dir)} in DDP rank {RANK}; the launching process starts it and passes {SOCKET_DIR_ENV}"
            )
        workers = os.environ.get(WORKERS_ENV)
        if workers is not None and not workers.strip().isdigit():
            raise ConfigError(
                f"{WORKERS_ENV}={workers!r} is not a worker count; set a whole number such as 2, or unset it"
            )
        count = {"workers": int(workers)} if workers else {}  # else DaemonConfig's default
        if dtype := os.environ.get(DTYPE_ENV):
            count["dtype"] = dtype  # DaemonConfig refuses another value, naming dtype
        imgsz = check_imgsz(self.args.imgsz, stride=32, floor=32, max_dim=1)
        tmp = tempfile.mkdtemp(prefix="pixpool-ul-")
        previous = os.environ.get(SOCKET_DIR_ENV)
        try:
            data_yaml = Path(tmp) / "train.yaml"
            split = self._train_split()
            data_yaml.write_text(yaml.safe_dump(split))
            config = DaemonConfig(
                data=str(data_yaml), imgsz=imgsz, no_val="val" not in split, task=self.args.task, **count
            )
            log.info(
                "pixpool: starting a daemon (%s workers, imgsz %d, task %s) for %s",
                config.workers,
                imgsz,
                config.task,
                self.data["train"],
            )
            self.pixpool_daemon_log = Path(self.save_dir) / DAEMON_LOG
            with serve_child(
                to_argv(config),
                socket_dir=self.pixpool_socket_dir,
                timeout_s=self.pixpool_timeout_s * 5,
                log_file=self.pixpool_daemon_log,
            ) as (
                _,
                sdir,
                status,
            ):
                self.pixpool_socket_dir, self.pixpool_status = sdir, status
                os.environ[SOCKET_DIR_ENV] = sdir  # for DDP ranks Ultralytics spawns from here
                log.info(notices.daemon_line(status, socket=ep.socket_path(sdir), started=True))
                log.info("pixpool: the daemon's log is %s", self.pixpool_daemon_log)
                yield
        finally:
            if previous is None:
                os.environ.pop(SOCKET_DIR_ENV, None)
            else:
                os.environ[SOCKET_DIR_ENV] = previous
            shutil.rmtree(tmp, ignore_errors=True)

    def _pixpool_workers(self) -> int:
        """The daemon's augmentation workers (0 before a daemon answered)."""
        return len(self.pixpool_status.workers) if self.pixpool_status is not None else 0

    def _take_served_imgsz(self, status: Status) -> None:
        """Train at the running daemon's imgsz when the user gave none (before Ultralytics'
        ``_setup_train`` reads ``args.imgsz``; DDP ranks get it in the arguments they are sent)."""
        served = status.snapshot.imgsz
        if self.pixpool_imgsz_given or not isinstance(served, int) or served == self.args.imgsz:
            return
        self.args.imgsz = served
        if RANK in (-1, 0):
            log.info("pixpool: imgsz=%d, the running daemon's (give imgsz= to ask for another)", served)
            args_file = Path(self.save_dir) / "args.yaml"  # written by Ultralytics before train(): keep it true
            if args_file.is_file():
                YAML.save(args_file, vars(self.args))

    def _train_split(self) -> dict:
        """A data.yaml of the training split exactly as Ultralytics resolved ``data=`` (absolute paths),
        with the split it validates on as ``val`` where the daemon's val split serves it."""
        train = self.data["train"]
        entries = [str(p) for p in train] if isinstance(train, (list, tuple)) else str(train)
        # single_cls renames the classes to one "item" in self.data; the label files keep
        # their ids, so the daemon reads them with the dataset's own names (the trainer zeroes cls).
        names = check_det_dataset(self.args.data)["names"] if self.args.single_cls else self.data["names"]
        names = [names[i] for i in range(len(names))] if isinstance(names, dict) else list(names)
        split = {"train": entries, "names": names}
        val = self.data.get(self.args.split or "val")  # the split Ultralytics validates on, served beside
        if val and not self._own_val_reason():
            split["val"] = [str(p) for p in val] if isinstance(val, (list, tuple)) else str(val)
        if hyp.spec_of(vars(self.args)).has_keypoints:  # the keypoint layout and the left-right pairs the route flips
            for key in ("kpt_shape", "flip_idx"):
                if self.data.get(key) is not None:
                    split[key] = [int(v) for v in self.data[key]]
        return split

    # -- loaders ------------------------------------------------------------------------
    def get_dataloader(self, dataset_path: str, batch_size: int = 16, rank: int = 0, mode: str = "train"):
        if mode != "train":
            return self._val_loader(dataset_path, batch_size, rank, mode)
        g_rank, world = distributed_rank() if RANK != -1 else (0, 1)
        settings = hyp.stream_settings(
            vars(self.args), batch_size=batch_size, rank=g_rank, world_size=world, data=self.data
        )
        # zero_copy: DetectionTrainer.preprocess_batch replaces batch["img"] with a float copy
        # (``.to(device).float() / 255``) before anything else reads it, the loss reads
        # batch["masks"] as ``.to(device).float()``, and the dict is rebuilt per batch
        # (``batches.py``), so no reference to the slot outlives the step.
        stream = Loader(
            settings,
            ClientOptions(
                socket_dir=self.pixpool_socket_dir,
                timeout_s=self.pixpool_timeout_s,
                zero_copy=True,
                expect=self._expected_data(),
            ),
        )
        try:
            self._check_names(stream.names)
            hyp.check_served(
                task=self.args.task,
                data=self.data,
                served_task=stream.task,
                served_kpt_shape=stream.kpt_shape,
                served_flip_idx=stream.flip_idx,
                where=f"the pixpool daemon at {ep.socket_path(self.pixpool_socket_dir)}",
            )
        except BaseException:
            stream.close()
            raise
        workers = self._pixpool_workers()
        return TrainLoader(
            stream,
            num_workers=workers,
            single_cls=bool(self.args.single_cls),
            classes=hyp.classes_of(self.args.classes),
            labels_source=lambda: self._labels(dataset_path),
        )

    def _val_loader(self, dataset_path: str, batch_size: int, rank: int, mode: str):
        """Ultralytics' validation batches from the daemon's val split (``val_loader.py``); where
        the daemon serves none, or the run asks what the daemon's split is not, Ultralytics' own
        loader, said in one line."""
        own = self._own_val_reason()
        if own:
            log.warning("pixpool: validation reads Ultralytics' own loader: %s", own)
            return super().get_dataloader(dataset_path, batch_size, rank, mode)
        g_rank, world = distributed_rank() if RANK != -1 else (0, 1)
        settings = val_loader.val_settings(
            batch_size=batch_size,
            imgsz=check_imgsz(self.args.imgsz, stride=32, floor=32, max_dim=1),
            stride=max(int(unwrap_model(self.model).stride.max()), 32),  # Ultralytics' build_dataset
            rank=g_rank,
            world_size=world,
            mask_ratio=int(self.args.mask_ratio),
            overlap_mask=bool(self.args.overlap_mask),
        )
        entries = [str(p) for p in dataset_path] if isinstance(dataset_path, (list, tuple)) else str(dataset_path)
        try:
            return val_loader.daemon_val_loader(
                settings,
                ClientOptions(
                    socket_dir=self.pixpool_socket_dir,
                    timeout_s=self.pixpool_timeout_s,
                    expect=expect_entries(entries, asked=f"data={self.args.data}", split="val"),
                ),
                check=self._check_served_val,
                num_workers=self._pixpool_workers(),
                single_cls=bool(self.args.single_cls),
                classes=hyp.classes_of(self.args.classes),
                labels_source=lambda: self._labels(dataset_path),
            )
        except ConfigError as exc:
            if getattr(exc, "field", None) != "split":
                raise
            log.warning("pixpool: %s; validation reads Ultralytics' own loader", exc)
            return super().get_dataloader(dataset_path, batch_size, rank, mode)

    def _own_val_reason(self) -> str | None:
        """Why this run's validation split is not the daemon's whole val split, or None."""
        share = get_split_fraction(self.args.fraction, self.args.split or "val")
        if share != 1.0:
            return f"fraction={self.args.fraction} validates on {share} of the split, the daemon serves all of it"
        if self.args.classes is not None and hyp.spec_of(vars(self.args)).has_masks:
            return "classes= cannot filter a segment batch (its mask planes number every instance)"
        return None

    def _check_served_val(self, stream) -> None:
        self._check_names(stream.names)
        hyp.check_served(
            task=self.args.task,
            data=self.data,
            served_task=stream.task,
            served_kpt_shape=stream.kpt_shape,
            served_flip_idx=stream.flip_idx,
            where=f"the pixpool daemon at {ep.socket_path(self.pixpool_socket_dir)} (its val split)",
        )

    def _expected_data(self) -> ExpectedData:
        """The training split this run names, as Ultralytics resolved ``data=`` (what a daemon this
        trainer starts would serve): the daemon found at the socket directory must serve it. The
        class names are ``_check_names``'s (``single_cls`` renames them on this side only), the
        task ``hyp.check_served``'s (its message names the ``--task`` to serve)."""
        return expect_entries(self._train_split()["train"], asked=f"data={self.args.data}")

    def _check_names(self, served: list[str]) -> None:
        if self.args.single_cls:
            return
        names = self.data["names"]
        expected = [names[i] for i in range(len(names))] if isinstance(names, dict) else list(names)
        if list(served) != expected:
            raise ConfigError(
                f"the pixpool daemon at {ep.socket_path(self.pixpool_socket_dir)} serves {len(served)} classes {served[:5]}... "
                f"but data={self.args.data} has {len(expected)} classes {expected[:5]}...; serve the same dataset or use another socket_dir"
            )

    def _labels(self, dataset_path: str) -> list:
        """Ultralytics' own labels of the training images (its label cache; no pixels), for
        ``max_det``, class weights and label plots; ``classes`` and ``single_cls`` applied.
        ``fraction=1.0``: the stream serves the whole split (``hyp`` refuses less), and
        ``mode="val"`` would otherwise take the validation split's share of a per-split list."""
        with override_configs(self.args, {"cache": False}) as args:
            return build_yolo_dataset(
                args, dataset_path, self.batch_size, self.data, mode="val", stride=32, fraction=1.0
            ).labels


class PixpoolDetectionTrainer(PixpoolStream, DetectionTrainer):
    """Ultralytics' ``DetectionTrainer`` whose training batches come from a pixpool daemon."""


class PixpoolSegmentationTrainer(PixpoolStream, SegmentationTrainer):
    """Ultralytics' ``SegmentationTrainer`` on a daemon serving ``--task segment``: the masks come
    rendered in the ring (``mask_ratio``, ``overlap_mask=True``), the trainer does no mask work."""


class PixpoolPoseTrainer(PixpoolStream, PoseTrainer):
    """Ultralytics' ``PoseTrainer`` on a daemon serving ``--task pose`` with the data.yaml's
    ``kpt_shape`` and ``flip_idx``."""


class PixpoolOBBTrainer(PixpoolStream, OBBTrainer):
    """Ultralytics' ``OBBTrainer`` on a daemon serving ``--task obb``: boxes as xywhr."""


# The trainer of each task pixpool serves (``hyp.SERVED_TASKS``).
TRAINERS: dict[str, type] = {
    "detect": PixpoolDetectionTrainer,
    "segment": PixpoolSegmentationTrainer,
    "pose": PixpoolPoseTrainer,
    "obb": PixpoolOBBTrainer,
}
