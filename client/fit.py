"""``fit``: train the reference detector on a daemon's stream, validate, checkpoint, resume.

Runs in the trainer process (``pixpool train``, the demo's trainers, a user's script).
Per epoch: the training stream (``attach``, ``drop_last`` so every batch fills the static
step) through ``DetectorStep``, a progress bar (loss, img/s, share of time spent waiting for
data), validation of the EMA model on the daemon's val split (letterboxed route, in order;
torch-only NMS; mAP@[.5:.95] and mAP@.5 by pycocotools' COCOeval, in the letterboxed
frame), one JSON line of metrics in ``PROJECT/results.jsonl``, and ``PROJECT/last.pt``
(plus ``best.pt`` when mAP improved).

A checkpoint holds the model, EMA, optimizer, step count, the next epoch, the RNG states and
the settings; ``resume`` continues to the run's total ``epochs`` on the exact stream: every
sample's bytes derive from (seed, epoch, index), so the resumed run sees the batches an
uninterrupted run would, and on the CPU computes the same losses.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..shared.errors import ConfigError
from ..shared.stream.config import AugmentConfig
from ..shared.stream.digest import batch_digest
from ._torch import require_torch

log = logging.getLogger(__name__)

CHECKPOINT_VERSION = 1


@dataclass(frozen=True)
class FitConfig:
    """What a training run is; ``augment`` is the stream's augmentation (``epochs`` is set from ``epochs``)."""

    epochs: int = 10
    batch_size: int = 16
    seed: int = 0
    scale: str = "n"
    optimizer: str = "SGD"
    lr: float = 0.01
    warmup_epochs: float = 1.0
    schedule: str = "cosine"
    device: str | None = None
    project: str = "runs/train"
    resume: str | None = None
    validate: bool = True
    val_batch_size: int = 16
    conf_thres: float = 0.001
    iou_thres: float = 0.7
    max_det: int = 300
    max_steps: int | None = None
    hsv_on_device: bool = False
    threads: int | None = None  # torch CPU threads (the demo gives each of its trainers its share of the cores)
    record_digests: bool = False  # a sha256 over each epoch's batch digests in results.jsonl (costs a hash per batch)
    follow_snapshot: bool = False  # go on when a restarted daemon serves another dataset (else SnapshotChangedError)
    log_every: int = 10
    progress: bool = True
    augment: AugmentConfig = field(default_factory=AugmentConfig)


def fit(
    config: FitConfig,
    *,
    socket_dir=None,
    endpoint=None,
    keys_dir=None,
    timeout_s: float = 120.0,
    wait_s: float = 0.0,
    on_attached=None,
    on_epoch=None,
) -> dict:
    """Train (see module docstring); returns the report ``pixpool train --json`` prints."""
    torch = require_torch("pixpool train")
    from .loader import attach
    from .step import DetectorStep

    device = config.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    if device == "cpu":
        torch.use_deterministic_algorithms(True, warn_only=True)
    ckpt = _load_checkpoint(config.resume, torch) if config.resume else None
    if ckpt is not None:
        _check_resumable(config, ckpt)
    project = Path(config.project)
    project.mkdir(parents=True, exist_ok=True)
    aug = dataclasses.replace(config.augment, epochs=config.epochs)
    start_epoch = ckpt["next_epoch"] if ckpt else 0
    # With HSV on the device the client moves each batch there and applies it; else the step's
    # pinned staging copies the slot view.
    on_device = dict(hsv_on_device=True, device=device) if config.hsv_on_device else {}
    # zero_copy: ``_train_epoch`` hands each batch to the step (a copy into its static or pinned
    # buffers, or the client's copy to the device) before it asks for the next, and keeps none.
    with attach(
        socket_dir,
        endpoint=endpoint,
        keys_dir=keys_dir,
        batch_size=config.batch_size,
        seed=config.seed,
        drop_last=True,
        start_epoch=start_epoch,
        timeout_s=timeout_s,
        wait_s=wait_s,
        zero_copy=True,
        follow_snapshot=config.follow_snapshot,
        **on_device,
        **dataclasses.asdict(aug),
    ) as train:
        if train.num_classes < 1:
            raise ConfigError(
                "the daemon did not say how many classes its dataset has; serve a COCO json or a data.yaml with names"
            )
        steps_per_epoch = len(train)
        if steps_per_epoch < 1:
            raise ConfigError(
                f"the dataset's shard has fewer records than one batch of {config.batch_size}; use a smaller batch_size (--batch-size)"
            )
        per_image = max(1, train.client.layout.max_targets // config.batch_size)
        step = DetectorStep(
            num_classes=train.num_classes,
            batch_size=config.batch_size,
            imgsz=aug.imgsz,
            max_targets=per_image,
            total_steps=config.epochs * steps_per_epoch,
            device=device,
            scale=config.scale,
            optimizer=config.optimizer,
            lr=config.lr,
            warmup_steps=max(1, round(config.warmup_epochs * steps_per_epoch)),
            schedule=config.schedule,
            seed=config.seed,
        )
        best = float("-inf")  # mAP50-95 with validation, else minus the loss
        if ckpt is not None:
            step.load_state_dict(ckpt["step"])
            _set_rng(ckpt["rng"], torch)
            best = ckpt["best"]
        val = _val_loader(train, socket_dir, endpoint, keys_dir, config, aug, timeout_s) if config.validate else None
        if on_attached is not None:
            on_attached()
        report = {
            "epochs": config.epochs,
            "start_epoch": start_epoch,
            "device": str(device),
            "graph": step.use_graph,
            "steps": 0,
            "images": 0,
            "train_s": 0.0,
            "wait_s": 0.0,
            "history": [],
        }
        results = project / "results.jsonl"
        try:
            for epoch in range(start_epoch, config.epochs):
                row = _train_epoch(train, step, epoch, config, report)
                if val is not None:
                    row.update(_validate(step.ema, val, config, aug.imgsz, device, torch))
                score = row.get("mAP50_95", -row["loss"])
                improved = score > best
                best = max(best, score)
                ckpt_path = _save_checkpoint(project, step, epoch, config, best, improved, torch)
                with results.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                report["history"].append(row)
                report["checkpoint"] = str(ckpt_path)
                if on_epoch is not None:
                    on_epoch(row)
                if config.max_steps is not None and report["steps"] >= config.max_steps:
                    break
        finally:
            if val is not None:
                val.close()
    last = report["history"][-1] if report["history"] else {}
    report.update(
        final_loss=last.get("loss"),
        metrics={k: last[k] for k in ("mAP50", "mAP50_95") if k in last},
        results=str(results),
        images_per_s=report["images"] / report["train_s"] if report["train_s"] else 0.0,
        data_wait_fraction=report["wait_s"] / report["train_s"] if report["train_s"] else 0.0,
    )
    return report


def _val_loader(train, socket_dir, endpoint, keys_dir, config: FitConfig, aug: AugmentConfig, timeout_s: float):
    from .loader import attach

    # zero_copy: ``_validate`` keeps only what it computes from a batch (predictions, boxes).
    try:
        return attach(
            socket_dir,
            endpoint=endpoint,
            keys_dir=keys_dir,
            batch_size=config.val_batch_size,
            split="val",
            imgsz=aug.imgsz,
            timeout_s=timeout_s,
            zero_copy=True,
            follow_snapshot=config.follow_snapshot,
        )
    except ConfigError as exc:
        if getattr(exc, "field", None) == "split":
            log.warning("no validation this run: %s", exc)
            return None
        raise


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
    losses, parts = [], None
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
            parts = step.losses()
            losses.append(parts["loss"])
            elapsed = time.perf_counter() - t0
            bar.set_postfix(
                loss=f"{parts['loss']:.3f}", img_s=f"{images / elapsed:.1f}", wait=f"{100 * wait / elapsed:.0f}%"
            )
        bar.update(1)
        last = time.perf_counter()
        if config.max_steps is not None and report["steps"] >= config.max_steps:
            break
    tail = step.losses()
    if tail is not None:
        losses.append(tail["loss"])
        parts = tail
    bar.close()
    elapsed = time.perf_counter() - t0
    report["images"] += images
    report["train_s"] += elapsed
    report["wait_s"] += wait
    terms = {k: parts[k] for k in ("box", "cls", "dfl")} if parts else {}
    if digests is not None:
        terms["data_sha256"] = digests.hexdigest()
    return {
        "epoch": epoch,
        "loss": float(np.mean(losses)) if losses else float("nan"),
        **terms,
        "lr": step.current_lr,
        "images_per_s": images / elapsed if elapsed else 0.0,
        "data_wait_fraction": wait / elapsed if elapsed else 0.0,
        "time_s": elapsed,
    }


def _validate(model, val, config: FitConfig, imgsz: int, device, torch) -> dict:
    from .detect.metrics import coco_map
    from .detect.postprocess import decode, nms

    model.eval()
    predictions, truth = [], []
    try:
        with torch.no_grad():
            for images, targets in val:
                feats = model(images.to(device).float().div_(255.0))
                boxes, scores = decode([f.float() for f in feats], model.strides, model.reg_max)
                for det in nms(
                    boxes, scores, conf_thres=config.conf_thres, iou_thres=config.iou_thres, max_det=config.max_det
                ):
                    predictions.append(det.cpu().numpy())
                rows = targets.numpy()
                for i in range(images.shape[0]):
                    r = rows[rows[:, 0] == i]
                    cx, cy, w, h = (r[:, 2:6] * imgsz).T
                    truth.append(
                        np.stack([r[:, 1], cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1).astype(np.float32)
                    )
    finally:
        model.train()
    return coco_map(predictions, truth, image_sizes=[(imgsz, imgsz)] * len(truth))


# -- checkpoints ---------------------------------------------------------------------------
def _settings(config: FitConfig) -> dict:
    d = dataclasses.asdict(config)
    transients = (
        "resume",
        "device",
        "progress",
        "max_steps",
        "project",
        "threads",
        "record_digests",
        "follow_snapshot",
    )
    for transient in transients:
        d.pop(transient)
    return d


def _save_checkpoint(project: Path, step, epoch: int, config: FitConfig, best: float, improved: bool, torch) -> Path:
    state = {
        "version": CHECKPOINT_VERSION,
        "step": step.state_dict(),
        "next_epoch": epoch + 1,
        "settings": _settings(config),
        "best": best,
        "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()},
    }
    last = project / "last.pt"
    tmp = project / "last.pt.tmp"
    torch.save(state, tmp)
    os.replace(tmp, last)  # a killed save never leaves a half-written last.pt
    if improved:
        torch.save(state, project / "best.pt")
    return last


def _load_checkpoint(path: str, torch) -> dict:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(
            f"checkpoint {p} does not exist; pass the last.pt of an earlier run (--resume)", field="resume"
        )
    state = torch.load(p, map_location="cpu", weights_only=False)
    if not isinstance(state, dict) or state.get("version") != CHECKPOINT_VERSION:
        raise ConfigError(f"{p} is not a pixpool checkpoint of version {CHECKPOINT_VERSION}", field="resume")
    return state


def _check_resumable(config: FitConfig, ckpt: dict) -> None:
    saved = ckpt["settings"]
    now = _settings(config)
    changed = sorted(k for k in now if k not in ("epochs",) and now[k] != saved.get(k))
    if changed:
        raise ConfigError(
            f"{config.resume} was trained with other settings ({', '.join(f'{k}={saved.get(k)!r}' for k in changed)}); "
            "resume with the same settings (only --epochs may grow)",
            field="resume",
        )
    if ckpt["next_epoch"] >= config.epochs:
        raise ConfigError(
            f"{config.resume} already finished epoch {ckpt['next_epoch']} of {config.epochs}; pass a larger --epochs to train on",
            field="epochs",
        )


def _set_rng(rng: dict, torch) -> None:
    torch.set_rng_state(rng["torch"])
    np.random.set_state(rng["numpy"])
    random.setstate(rng["python"])


def fit_process(config_dict: dict, socket_dir: str, queue) -> None:
    """Entry point of a spawned trainer process (the demo's): fit, reporting to ``queue``.

    Puts ("attached", pid, None), ("epoch", pid, row) per epoch, then ("done", pid, report)
    or ("error", pid, text)."""
    pid = os.getpid()
    try:
        augment = AugmentConfig.from_dict(config_dict.pop("augment"))
        config = FitConfig(**config_dict, augment=augment)
        report = fit(
            config,
            socket_dir=socket_dir,
            on_attached=lambda: queue.put(("attached", pid, None)),
            on_epoch=lambda row: queue.put(("epoch", pid, row)),
        )
        queue.put(("done", pid, {k: v for k, v in report.items() if k != "history"}))
    except Exception as exc:  # reported to the parent, which owns the exit status
        queue.put(("error", pid, f"{type(exc).__name__}: {exc}"))
