"""``fit``: train the reference detector on a daemon's stream, validate, checkpoint, resume.

Runs in the trainer process (``pixpool train``, the demo's trainers, a user's script).
Per epoch: the training stream (``attach``, ``drop_last`` so every batch fills the static
step) through ``DetectorStep``, a progress bar (loss, img/s, share of time spent waiting for
data), validation of the EMA model on the daemon's val split with its own progress bar
(Ultralytics' rect validation batches: sorted by aspect ratio, each letterboxed into its batch's
shape, ``client/rect_view.py``; torch-only NMS; mAP@[.5:.95] and mAP@.5 by pycocotools'
COCOeval, in the letterboxed frame), one JSON line of metrics in ``RUN/results.jsonl``, and
``RUN/last.pt`` (plus ``best.pt`` when mAP improved). ``RUN`` is ``project``, or its next free name when it
exists (``run_dir.py``), made once the run has attached.

The validation stream is a second session with its own ring in the daemon; it is attached
for each validation pass and closed after it (once at the start too, so that a daemon
without a val split, or serving another dataset, is named before the first epoch), so
between validations a trainer costs the service one ring, not two. Each pass waits for a
restarting daemon as the training stream does (up to ``timeout_s``, or the run's ``wait_s``
where longer) and must find the snapshot the first pass read, else ``SnapshotChangedError``
unless ``follow_snapshot`` (``client/pass_stream.py``).

Ctrl-C: ``fit`` raises ``Interrupted`` (a KeyboardInterrupt) naming the run's last
checkpoint, or, where none was saved yet, after removing the run folder it made (it holds
nothing): ``pixpool train`` prints the resume line from it.

A checkpoint (``checkpoint.py``) holds the model, EMA, optimizer, step count, the next
epoch, the RNG states, the run's settings and the snapshot it trained on. ``resume`` alone
restores them and continues in the checkpoint's folder to the run's total ``epochs`` on the
exact stream: every sample's bytes derive from (seed, epoch, index), so the resumed run sees
the batches an uninterrupted run would, and on the CPU computes the same losses. A larger
``epochs`` needs ``extend`` and is not exact (``FitConfig.extend``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import random
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ...shared.errors import ConfigError
from ...shared.stream import served_data
from ...shared.stream.digest import batch_digest
from ...shared.stream.route import Route
from .. import snapshot_check
from .._torch import require_torch
from ..options import ClientOptions
from . import checkpoint, run_dir
from .fit_config import FitConfig, explicit_settings, flat_settings

__all__ = ["FIT_OPTIONS", "FitConfig", "Interrupted", "fit", "fit_process"]

# A run's options where it names none: the local daemon, which has 120 s to answer.
FIT_OPTIONS = ClientOptions(timeout_s=120.0)

log = logging.getLogger(__name__)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during ``fit``: ``checkpoint`` is the run's latest ``last.pt`` (None when the run
    saved none; then ``removed`` is the empty run folder ``fit`` made and took away again)."""

    def __init__(self, *, checkpoint: Path | None, run_dir: Path, epoch: int, removed: bool):
        self.checkpoint, self.run_dir, self.epoch, self.removed = checkpoint, run_dir, epoch, removed
        if checkpoint is not None:
            text = f"interrupted in epoch {epoch + 1}; the run's last checkpoint is {checkpoint}"
        else:
            text = f"interrupted in epoch {epoch + 1} before any checkpoint; " + (
                f"removed the empty run folder {run_dir}" if removed else f"nothing saved in {run_dir}"
            )
        super().__init__(text)


def fit(
    config: FitConfig,
    options: ClientOptions | None = None,
    *,
    given: set[str] | None = None,
    on_attached: Callable[[Path, FitConfig], None] | None = None,
    on_epoch: Callable[[dict], None] | None = None,
    data=None,
    images=None,
) -> dict:
    """Train (see module docstring); returns the report ``pixpool train --json`` prints.

    ``options``: where the daemon is and how long to wait for it (``socket_dir`` or
    ``endpoint`` with ``keys_dir``, ``timeout_s``, ``wait_s``; default ``FIT_OPTIONS``, which
    gives a daemon 120 s to answer). The rest of them are the run's: its streams take batches
    as views, follow the snapshot as ``config.follow_snapshot`` says and expect ``data``.
    ``given``: with ``resume``, the settings the caller set on purpose (paths such as
    ``stream.seed``, ``checkpoint.resumed_config``), each of which must equal the
    checkpoint's; default: the fields of ``config`` that differ from their defaults.
    ``on_attached(run_folder, config)``: called once the run folder exists, before the first
    step, with the config the run goes on with (a resumed run's restored settings).
    ``data`` (and ``images`` for a COCO json): the dataset the run must train on; a daemon
    serving another is refused (``attach(data=)``), and its validation split too where
    ``data`` is a data.yaml with ``val:``. None: whatever the daemon serves."""
    torch = require_torch("pixpool train")
    from ..loader import Loader, distributed_rank, expected_data
    from .step import DetectorStep

    options = FIT_OPTIONS if options is None else options

    given = explicit_settings(config) if given is None else set(given)
    config = _with_rank(config, distributed_rank(), given)
    ckpt = None
    if config.resume:
        ckpt = checkpoint.load(config.resume, torch)
        config = checkpoint.resumed_config(config, ckpt, given=given)
    device = config.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    if device == "cpu":
        torch.use_deterministic_algorithms(True, warn_only=True)
    start_epoch = ckpt["next_epoch"] if ckpt else 0
    batch_size = config.stream.batch_size
    stream = dataclasses.replace(
        config.stream,
        drop_last=True,
        start_epoch=start_epoch,
        split="train",
        augment=dataclasses.replace(config.stream.augment, epochs=config.epochs),
    )
    # With HSV on the device the client moves each batch there and applies it; else the step's
    # pinned staging copies the slot view.
    # zero_copy: ``_train_epoch`` hands each batch to the step (a copy into its static or pinned
    # buffers, or the client's copy to the device) before it asks for the next, and keeps none.
    options = options.replace(zero_copy=True, follow_snapshot=config.follow_snapshot, device=None, expect=None)
    train_options = options.replace(
        device=device if stream.hsv_on_device else None,
        expect=expected_data(data, images, split=stream.split),
    )
    with Loader(stream, train_options) as train:
        if train.num_classes < 1:
            raise ConfigError(
                "the daemon did not say how many classes its dataset has; serve a COCO json or a data.yaml with names"
            )
        if not train.client.spec.rows_are_boxes:  # a segment set's rows are its boxes: a detector trains on them
            raise ConfigError(
                f"pixpool train trains a detector on rows of 6 columns; the daemon serves the {train.task} task "
                f"(rows of {train.client.layout.target_width}); train it with Ultralytics: "
                f"pixpool yolo train task={train.task}",
                field="task",
            )
        if ckpt is not None:
            _check_snapshot(ckpt, train.client, config)
        # The square size the daemon renders: the stream's imgsz, or the daemon's where it names none.
        imgsz = train.client.layout.imgsz
        steps_per_epoch = len(train)
        if steps_per_epoch < 1:
            raise ConfigError(
                f"the dataset's shard has fewer records than one batch of {batch_size}; "
                "use a smaller batch_size (--batch-size)"
            )
        per_image = max(1, train.client.layout.max_targets // batch_size)
        step = DetectorStep(
            num_classes=train.num_classes,
            batch_size=batch_size,
            imgsz=imgsz,
            max_targets=per_image,
            total_steps=config.epochs * steps_per_epoch,
            device=device,
            scale=config.scale,
            optimizer=config.optimizer,
            lr=config.lr,
            warmup_steps=max(1, round(config.warmup_epochs * steps_per_epoch)),
            schedule=config.schedule,
            seed=stream.seed,
        )
        best = float("-inf")  # mAP50-95 with validation, else minus the loss
        if ckpt is not None:
            step.load_state_dict(ckpt["step"])
            _set_rng(ckpt["rng"], torch)
            best = ckpt["best"]
        val_data = data if data is not None and served_data.names_split(data, "val") else None
        val = None
        if config.validate:
            stride = max(max(step.ema.strides), 32)  # Ultralytics' rect validation batches for this model
            val = _ValStream(train, options, config, imgsz, stride, data=val_data)
            if not val.probe():
                val = None
        # Made only now: every refusal (settings, checkpoint, snapshot, the daemon's) came before.
        # A folder this run made (not a checkpoint's, not one reused with exist_ok) goes again if Ctrl-C
        # comes before anything was saved in it.
        made = ckpt is None and not (config.exist_ok and Path(config.project).is_dir())
        folder = Path(config.resume).parent if ckpt else run_dir.claim(config.project, exist_ok=config.exist_ok)
        saved = Path(config.resume) if ckpt else None
        epoch = start_epoch
        try:
            # What the checkpoint records: the settings as they ran, imgsz as the daemon served it.
            ran = dataclasses.replace(
                config,
                stream=dataclasses.replace(
                    config.stream, augment=dataclasses.replace(config.stream.augment, imgsz=imgsz)
                ),
            )
            if on_attached is not None:
                on_attached(folder, config)
            report = {
                "epochs": config.epochs,
                "start_epoch": start_epoch,
                "run_dir": str(folder),
                "device": str(device),
                "graph": step.use_graph,
                "steps": 0,
                "images": 0,
                "train_s": 0.0,
                "wait_s": 0.0,
                "history": [],
            }
            results = folder / "results.jsonl"
            # A resumed run goes on with its file; a new one (also into a reused folder) starts its own.
            mode = "a" if ckpt else "w"
            for epoch in range(start_epoch, config.epochs):
                row = _train_epoch(train, step, epoch, config, report)
                if val is not None:
                    t0 = time.perf_counter()
                    with val.open(epoch=epoch) as loader:
                        row.update(_validate(step.ema, loader, config, device, torch, epoch=epoch))
                    row["val_time_s"] = time.perf_counter() - t0
                score = row.get("mAP50_95", -row["loss"])
                improved = score > best
                best = max(best, score)
                state = {
                    "step": step.state_dict(),
                    "next_epoch": epoch + 1,
                    "settings": flat_settings(ran),
                    "snapshot": dict(train.client.snapshot),
                    "best": best,
                    "rng": {
                        "torch": torch.get_rng_state(),
                        "numpy": np.random.get_state(),
                        "python": random.getstate(),
                    },
                }
                ckpt_path = saved = checkpoint.save(folder, state, improved=improved, torch=torch)
                with results.open(mode) as f:
                    f.write(json.dumps(row) + "\n")
                mode = "a"
                report["history"].append(row)
                report["checkpoint"] = str(ckpt_path)
                if on_epoch is not None:
                    on_epoch(row)
                if config.max_steps is not None and report["steps"] >= config.max_steps:
                    break
        except KeyboardInterrupt:
            removed = saved is None and made and run_dir.release(folder)
            raise Interrupted(checkpoint=saved, run_dir=folder, epoch=epoch, removed=removed) from None
    last = report["history"][-1] if report["history"] else {}
    report.update(
        final_loss=last.get("loss"),
        metrics={k: last[k] for k in ("mAP50", "mAP50_95") if k in last},
        results=str(results),
        images_per_s=report["images"] / report["train_s"] if report["train_s"] else 0.0,
        data_wait_fraction=report["wait_s"] / report["train_s"] if report["train_s"] else 0.0,
    )
    return report


def _with_rank(config: FitConfig, env: tuple[int, int], given: set[str]) -> FitConfig:
    """Rank and world size left at 0/1 come from torch.distributed or RANK/WORLD_SIZE (``env``);
    taken from there they count as given (a resume under another world size is refused)."""
    if (config.stream.rank, config.stream.world_size) != (0, 1) or env == (0, 1):
        return config
    given.update(("stream.rank", "stream.world_size"))
    rank, world_size = env
    return dataclasses.replace(config, stream=dataclasses.replace(config.stream, rank=rank, world_size=world_size))


def _check_snapshot(ckpt: dict, client, config: FitConfig) -> None:
    """Refuse to resume onto another snapshot than the run trained on, unless ``follow_snapshot``."""
    before, after = checkpoint.saved_snapshot(ckpt), client.snapshot
    if before is None or not snapshot_check.changed(before, after):
        return
    error = checkpoint.snapshot_refusal(before, after, checkpoint=config.resume, endpoint=client.endpoint)
    if not config.follow_snapshot:
        raise error
    log.warning("resuming on another snapshot (follow_snapshot=True): %s", error)


class _ValStream:
    """The run's validation stream, attached only while it is read (module docstring)."""

    def __init__(self, train, options: ClientOptions, config: FitConfig, imgsz: int, stride: int, *, data):
        from ..loader import expected_data
        from ..pass_stream import PassStreams

        # The stream's settings by name (``loader.stream_settings``); ``options`` the run's, with
        # the val files listed once, not per pass.
        self._kwargs = dict(
            batch_size=config.val_batch_size,
            split="val",
            imgsz=imgsz,
            rect_stride=stride,
            rank=train.settings.rank,
            world_size=train.settings.world_size,
        )
        # zero_copy: ``_validate`` keeps only what it computes from a batch (predictions, boxes).
        self._options = options.replace(zero_copy=True, expect=expected_data(data, split="val"))
        # Each pass attaches afresh: it waits for a restarting daemon as the training stream
        # does, and stays on the first pass's snapshot (``client/pass_stream.py``).
        self._passes = PassStreams(self._attach, self._options)

    def _attach(self, wait_s: float):
        from ..loader import Loader, stream_settings

        return Loader(stream_settings(**self._kwargs), self._options.replace(wait_s=wait_s))

    def open(self, *, epoch: int | None = None):
        what = "validation pass" if epoch is None else f"validation pass after epoch {epoch + 1}"
        return self._passes.open(what=what)

    def probe(self) -> bool:
        """Attach once and detach: False (with a warning) when the daemon serves no val split.
        The rect batches' shapes are planned from the decoded sizes the daemon sends
        (``rect_view.py``); where it sends none (an earlier release) they come from the val
        images' headers, and a trainer that cannot read those (over TCP from another machine,
        the daemon's paths mounted elsewhere) validates on the square letterbox, said once."""
        try:
            stream = self.open()
        except ConfigError as exc:
            if getattr(exc, "field", None) == "split":
                log.warning("no validation this run: %s", exc)
                return False
            raise
        try:
            files = stream.files
            if files.sizes() is not None:
                unreadable = None
            else:
                unreadable = (
                    next((f for f in files if not os.access(f, os.R_OK)), None) if len(files) else "(none named)"
                )
        finally:
            stream.close()
        if unreadable is not None and self._kwargs["rect_stride"]:
            log.warning(
                "validation on the square letterbox, not Ultralytics' rect batches: this trainer cannot read the "
                "val images their shapes are planned from (%s); run the trainer where the daemon's files are to "
                "validate as Ultralytics does",
                unreadable,
            )
            self._kwargs["rect_stride"] = 0
        return True


def _train_epoch(train, step, epoch: int, config: FitConfig, report: dict) -> dict:
    from tqdm import tqdm

    train.set_epoch(epoch)
    bar = tqdm(
        total=len(train),
        desc=f"epoch {epoch + 1}/{config.epochs}",
        unit="batch",
        disable=not config.progress,
        leave=False,
    )
    images = 0
    t0 = last = time.perf_counter()
    wait = 0.0
    # Per read of the step's losses: (steps summed, their means): the epoch's means weigh each
    # read by its steps, as Ultralytics' running mean of box/cls/dfl weighs each batch.
    reads: list[tuple[int, dict]] = []
    digests = hashlib.sha256() if config.record_digests else None
    for batch in train:
        now = time.perf_counter()
        wait += now - last
        images_t, targets = batch
        if digests is not None:
            digests.update(batch_digest(images_t.numpy(), targets.numpy()).encode())
        step.step(images_t, targets.numpy(), files=batch.files)
        images += len(batch.indices)
        report["steps"] += 1
        if step.unread_steps >= config.log_every:
            summed = step.unread_steps
            parts = step.losses()
            reads.append((summed, parts))
            elapsed = time.perf_counter() - t0
            bar.set_postfix(
                box=f"{parts['box']:.3f}",
                cls=f"{parts['cls']:.3f}",
                dfl=f"{parts['dfl']:.3f}",
                img_s=f"{images / elapsed:.1f}",
                wait=f"{100 * wait / elapsed:.0f}%",
            )
        bar.update(1)
        last = time.perf_counter()
        if config.max_steps is not None and report["steps"] >= config.max_steps:
            break
    summed = step.unread_steps
    tail = step.losses()
    if tail is not None:
        reads.append((summed, tail))
    bar.close()
    elapsed = time.perf_counter() - t0
    report["images"] += images
    report["train_s"] += elapsed
    report["wait_s"] += wait
    steps = sum(n for n, _ in reads)
    mean = {k: sum(n * r[k] for n, r in reads) / steps for k in ("loss", "box", "cls", "dfl")} if steps else {}
    terms = {k: mean[k] for k in ("box", "cls", "dfl")} if steps else {}
    if digests is not None:
        terms["data_sha256"] = digests.hexdigest()
    return {
        "epoch": epoch,
        # (box + cls + dfl) x batch size, as Ultralytics' loss before backward; box/cls/dfl are
        # what its progress bar shows (box_loss, cls_loss, dfl_loss)
        "loss": mean.get("loss", float("nan")),
        **terms,
        "lr": step.current_lr,
        "images_per_s": images / elapsed if elapsed else 0.0,
        "data_wait_fraction": wait / elapsed if elapsed else 0.0,
        "time_s": elapsed,
    }


def _validate(model, val, config: FitConfig, device, torch, *, epoch: int = 0) -> dict:
    from tqdm import tqdm

    from ..rect_view import RectView
    from .detect.metrics import coco_map
    from .detect.postprocess import decode, nms

    model.eval()
    predictions, truth, sizes = [], [], []
    view = RectView(val) if val.settings.augment.route is Route.RECT_VAL else None  # else the square letterbox (probe)
    bar = tqdm(
        val,
        total=len(val),
        desc=f"val {epoch + 1}/{config.epochs}",
        unit="batch",
        disable=not config.progress,
        leave=False,
    )
    try:
        with torch.no_grad():
            for batch in bar:
                if view is not None:
                    images, _, (height, width) = view.crop(batch)  # the batch's own rect shape
                else:
                    images = batch.images
                    height, width = images.shape[-2:]
                feats = model(images.to(device).float().div_(255.0))
                boxes, scores = decode([f.float() for f in feats], model.strides, model.reg_max)
                for det in nms(
                    boxes, scores, conf_thres=config.conf_thres, iou_thres=config.iou_thres, max_det=config.max_det
                ):
                    predictions.append(det.cpu().numpy())
                rows = batch.targets.numpy()
                for i in range(images.shape[0]):
                    r = rows[rows[:, 0] == i]
                    cx, cy, w, h = (r[:, 2:6] * np.array([width, height, width, height], np.float32)).T
                    sizes.append((height, width))
                    truth.append(
                        np.stack([r[:, 1], cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1).astype(np.float32)
                    )
    finally:
        bar.close()
        model.train()
    return coco_map(predictions, truth, image_sizes=sizes)


def _set_rng(rng: dict, torch) -> None:
    torch.set_rng_state(rng["torch"])
    np.random.set_state(rng["numpy"])
    random.setstate(rng["python"])


def fit_process(config: FitConfig, socket_dir: str, queue) -> None:
    """Entry point of a spawned trainer process (the demo's): fit, reporting to ``queue``.

    Puts ("attached", pid, run_folder), ("epoch", pid, row) per epoch, then ("done", pid,
    report) or ("error", pid, text)."""
    pid = os.getpid()
    try:
        report = fit(
            config,
            FIT_OPTIONS.replace(socket_dir=socket_dir),
            on_attached=lambda folder, _: queue.put(("attached", pid, str(folder))),
            on_epoch=lambda row: queue.put(("epoch", pid, row)),
        )
        queue.put(("done", pid, {k: v for k, v in report.items() if k != "history"}))
    except Exception as exc:  # reported to the parent, which owns the exit status
        queue.put(("error", pid, f"{type(exc).__name__}: {exc}"))
