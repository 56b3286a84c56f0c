"""A trainer's loop over the daemon's stream: attach, train epochs, report.

Runs in the trainer process (``pixpool train``, the demo's trainer processes, a user's own
script). Each batch is read in place from its ring slot, copied once into pinned staging
and the step's static device buffers, and the slot goes back to the daemon when the next
batch is asked for.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np

from ..shared.config import StreamSettings
from ..shared.errors import ConfigError
from .iterator import Client

log = logging.getLogger(__name__)


@dataclass
class TrainReport:
    pid: int
    seed: int
    device: str
    graph: bool
    steps: int = 0
    images: int = 0
    seconds: float = 0.0
    losses: list[float] = field(default_factory=list)
    samples_per_epoch: dict[int, int] = field(default_factory=dict)

    @property
    def images_per_s(self) -> float:
        return self.images / self.seconds if self.seconds else 0.0


def train_on_daemon(settings: StreamSettings, *, epochs: int, num_classes: int | None = None, socket_dir=None, endpoint=None,
                    keys_dir=None, device: str | None = None, max_steps: int | None = None, timeout_s: float = 120.0,
                    on_attached=None) -> TrainReport:
    """Train the small detector on ``epochs`` epochs of this stream; return what happened.

    ``num_classes`` defaults to the daemon's dataset; the model is seeded with the stream's
    seed, so the same seed trains the same model on the same bytes.
    """
    import os

    from ._torch import require_torch

    torch = require_torch("training on the daemon's stream")
    from .train import TrainStep

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    # Plain slot views go through the step's pinned staging; with HSV on the device the
    # client moves each batch to the device itself and applies HSV there.
    on_device = dict(as_torch=True, device=device) if settings.hsv_on_device else dict(as_torch=False)
    with Client(settings, socket_dir=socket_dir, endpoint=endpoint, keys_dir=keys_dir, timeout_s=timeout_s, **on_device) as client:
        if num_classes is None:
            num_classes = len(client.names)
            if num_classes < 1:
                raise ConfigError("the daemon did not say how many classes its dataset has; pass num_classes (--num-classes)", field="num_classes")
        torch.manual_seed(settings.seed)
        step = TrainStep(num_classes=num_classes, batch_size=settings.batch_size, imgsz=settings.augment.imgsz, device=device)
        report = TrainReport(pid=os.getpid(), seed=settings.seed, device=str(device), graph=step.use_graph)
        if on_attached is not None:
            on_attached()
        t0 = time.perf_counter()
        for epoch in range(settings.start_epoch, settings.start_epoch + epochs):
            for batch in client.epoch(epoch):
                if len(batch.samples) != settings.batch_size:
                    # The last, short batch of an epoch (drop_last=False): the captured
                    # step has a static batch size, so it is counted but not trained on.
                    report.samples_per_epoch[epoch] = report.samples_per_epoch.get(epoch, 0) + len(batch.samples)
                    continue
                labels = np.asarray(batch.targets)
                if len(labels) and labels[:, 1].max() >= num_classes:
                    raise ConfigError(f"batch {batch.batch} of epoch {epoch} has class {int(labels[:, 1].max())}, but the detector predicts "
                                      f"{num_classes} classes; pass num_classes (--num-classes) of at least {int(labels[:, 1].max()) + 1}", field="num_classes")
                loss = step.step(batch.images, labels)
                report.losses.append(loss)
                report.steps += 1
                report.images += len(batch.samples)
                report.samples_per_epoch[epoch] = report.samples_per_epoch.get(epoch, 0) + len(batch.samples)
                if max_steps is not None and report.steps >= max_steps:
                    break
            if max_steps is not None and report.steps >= max_steps:
                break
        report.seconds = time.perf_counter() - t0
    log.info("trainer %d (seed %d): %d steps, %.1f img/s, loss %.3f -> %.3f", report.pid, report.seed, report.steps,
             report.images_per_s, report.losses[0] if report.losses else float("nan"), report.losses[-1] if report.losses else float("nan"))
    return report


def trainer_process(settings_dict: dict, socket_dir: str, epochs: int, num_classes: int, queue, max_steps: int | None = None) -> None:
    """Entry point of a spawned trainer process: train, then put the report on ``queue``."""
    import dataclasses
    import os

    settings = StreamSettings.from_dict(settings_dict)
    try:
        report = train_on_daemon(settings, epochs=epochs, num_classes=num_classes, socket_dir=socket_dir,
                                 max_steps=max_steps, on_attached=lambda: queue.put(("attached", os.getpid(), None)))
        queue.put(("done", os.getpid(), dataclasses.asdict(report) | {"images_per_s": report.images_per_s}))
    except Exception as exc:  # reported to the parent, which owns the exit status
        queue.put(("error", os.getpid(), f"{type(exc).__name__}: {exc}"))
