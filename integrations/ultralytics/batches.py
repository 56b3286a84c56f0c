"""One pixpool batch -> the dict Ultralytics' loss and trainer read, per task.

Runs in the trainer process; imports torch, not Ultralytics. The layout is the
one Ultralytics' ``Format`` transform and ``YOLODataset.collate_fn`` produce together:

- ``img``: uint8 (B, 3, S, S) RGB tensor (``DetectionTrainer.preprocess_batch`` moves it to
  the device and divides by 255). From ``PixpoolDetectionTrainer``'s stream
  (``zero_copy=True``) it is the ring slot itself, not a copy: valid until the next batch is
  asked for, which is how Ultralytics' loop uses it (``preprocess_batch`` replaces it with
  a float copy at once).
- ``cls`` float32 (n, 1), ``bboxes`` float32 (n, 4) normalised ``cx, cy, w, h``,
  ``batch_idx`` float32 (n,): copies of the slot's target rows (a few hundred bytes).
- ``im_file``: tuple of B image paths; ``ori_shape``: tuple of B ``(h, w)`` of the decoded
  files (EXIF orientation applied, as ``cv2.imread`` does); ``resized_shape``: ``(S, S)``
  each; ``ratio_pad``: the long-side resize gains, as Ultralytics' ``load_image`` gives them.
  For a mosaic these describe the sample's own record, as Ultralytics' do for its first tile.

Beside these, per task (the pixpool target row is ``(batch_index, class, cx, cy, w, h)``
then the task's columns, ``shared/task.py``):

- segment: ``masks`` (B, M, M), M = imgsz // mask_ratio: the batch's mask planes (0
  background, i + 1 instance i of the image in the order of its rows, the rows sorted by
  descending mask area, as Ultralytics' ``polygons2masks_overlap`` numbers them). uint8, or
  int32 where the ring holds int32 planes (an image of more than 255 instances); float32
  when an image of the batch has no instance, because Ultralytics' ``Format`` gives such an
  image float zeros and ``torch.cat`` promotes the batch. ``sem_masks`` float32 (B, M, M):
  the class of the instance at each mask pixel, where the mask is 0 the class of the image's
  last row (Ultralytics indexes ``cls[mask - 1]``; its loss reads only the covered pixels),
  all 0 for an image without instances.
- pose: ``keypoints`` float32 (n, K, 3): x, y normalised by the image side, visibility (a
  (K, 2) dataset's visibility is made by the reader as Ultralytics' label reader makes it).
- obb: ``bboxes`` float32 (n, 5): normalised cx, cy, w, h and the angle in radians (xywhr).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ...client.rect_view import decoded_shape
from ...shared.task import BASE_COLUMNS, DETECT, TaskSpec


def resize_gain(shape: tuple[int, int], imgsz: int) -> tuple[float, float]:
    """(h, w) gains of resizing the long side to ``imgsz`` (Ultralytics' ``load_image`` rounding)."""
    h0, w0 = shape
    r = imgsz / max(h0, w0)
    if r == 1:
        return 1.0, 1.0
    h, w = min(math.ceil(h0 * r), imgsz), min(math.ceil(w0 * r), imgsz)
    return h / h0, w / w0


class ShapeCache:
    """``decoded_shape`` per file, read once per file (a header read each, on first use)."""

    def __init__(self) -> None:
        self._shapes: dict[str, tuple[int, int]] = {}

    def __call__(self, path: str) -> tuple[int, int]:
        shape = self._shapes.get(path)
        if shape is None:
            shape = self._shapes[path] = decoded_shape(path)
        return shape


@dataclass
class StreamFormat:
    """One run's ``to_ultralytics``: the served task, the run's class settings and the image
    side, the files' shapes read once (``TrainLoader``, ``ValLoader``)."""

    imgsz: int
    task: TaskSpec = DETECT
    single_cls: bool = False
    classes: tuple[int, ...] | None = None
    shapes: ShapeCache = field(default_factory=ShapeCache)

    def __call__(self, images: Any, targets: Any, files: list[str], masks: Any = None) -> dict[str, Any]:
        return to_ultralytics(
            images,
            targets,
            files,
            imgsz=self.imgsz,
            shapes=self.shapes,
            single_cls=self.single_cls,
            classes=self.classes,
            task=self.task,
            masks=masks,
        )


def to_ultralytics(
    images: Any,
    targets: Any,
    files: list[str],
    *,
    imgsz: int,
    shapes: ShapeCache,
    single_cls: bool = False,
    classes: tuple[int, ...] | None = None,
    task: TaskSpec = DETECT,
    kpt_shape: tuple[int, int] | None = None,
    masks: Any = None,
) -> dict[str, Any]:
    """The Ultralytics batch dict of one pixpool batch of ``task``: ``images`` uint8 (B, 3, S, S),
    ``targets`` float32 (n, W) with W = the task's ``target_width(kpt_shape)``, ``masks`` the batch's
    mask planes (B, M, M) for segment (None otherwise). ``classes``: keep only the rows of these
    class ids (Ultralytics' ``classes=``; before ``single_cls`` zeroes them, as its
    ``update_labels`` orders the two); not for segment, whose mask planes number every row."""
    spec = task
    kpt_shape = spec.kpt_shape if kpt_shape is None else kpt_shape  # a dataset's spec carries its own
    width = spec.target_width(kpt_shape)
    if targets.ndim != 2 or targets.shape[1] != width:
        raise ValueError(
            f"pixpool targets of shape {tuple(targets.shape)} do not fit the {spec.name!r} task's rows of {width} columns; "
            f"the daemon serves another task or keypoint layout (serve with `pixpool serve --task {spec.name}`)"
        )
    if classes is not None:
        if spec.has_masks:
            raise ValueError("classes= cannot filter a segment batch: its mask planes number every instance")
        import torch

        targets = targets[torch.isin(targets[:, 1], torch.tensor(classes, dtype=targets.dtype))]
    cls = targets[:, 1:2].clone()
    if single_cls:
        cls.zero_()
    ori = tuple(shapes(f) for f in files)
    out = {
        "batch_idx": targets[:, 0].clone(),
        "bboxes": targets[:, 2 : BASE_COLUMNS + (1 if spec.rotated else 0)].clone(),  # obb: xywhr
        "cls": cls,
        "im_file": tuple(files),
        "img": images,
        "ori_shape": ori,
        "ratio_pad": tuple(resize_gain(s, imgsz) for s in ori),
        "resized_shape": tuple((imgsz, imgsz) for _ in files),
    }
    if spec.has_keypoints:
        out["keypoints"] = targets[:, BASE_COLUMNS:].reshape(len(targets), int(kpt_shape[0]), 3).clone()
    elif spec.has_masks:
        if masks is None:
            raise ValueError(
                "a segment batch carries no masks; the daemon serves another task (serve with --task segment)"
            )
        out["masks"], out["sem_masks"] = _segment_masks(masks, out["batch_idx"], cls[:, 0])
    return out


def _segment_masks(masks: Any, batch_idx: Any, cls: Any) -> tuple[Any, Any]:
    """(``masks``, ``sem_masks``) as Ultralytics' ``Format`` + ``collate_fn`` give them, from the
    batch's mask planes (B, M, M) and its rows' image indices and classes (rows of an image in
    mask order)."""
    import torch

    count = masks.shape[0]
    per_image = torch.bincount(batch_idx.long(), minlength=count)
    if count and int(per_image.min()) == 0:
        masks = masks.float()  # Ultralytics: an image without instances is float zeros; cat promotes
    # Lookup table per image: entry k (1..n) the class of its k-th row, entry 0 the class of its
    # last row (Ultralytics' cls[mask - 1] at mask 0), all 0 for an image without rows.
    table = torch.zeros(count, int(per_image.max()) + 1 if count else 1, dtype=torch.float32)
    if len(cls):
        start = torch.cumsum(per_image, 0) - per_image  # first row of each image
        image = batch_idx.long()
        rank = torch.arange(len(cls)) - start[image]  # 0-based position of each row in its image
        table[image, rank + 1] = cls.float()
        has = per_image > 0
        table[has, 0] = table[has, per_image[has]]
    sem = torch.gather(table, 1, masks.reshape(count, -1).long()).reshape(masks.shape)
    return masks, sem
