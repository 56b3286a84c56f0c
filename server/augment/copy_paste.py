"""Copy-paste (flip mode) with the union mask: each source coordinate is copied once.

Runs wherever a sample is rendered: the draws, labels and union mask for the kernel
(``kernel.py`` reads the mirrored pixel where the mask is set), and the standalone
image form the tests use.

Flip mode: the source is the sample mirrored left-right, and its instances mirrored with
it. An instance is eligible when it has a polygon and its mirrored box overlaps every
existing box by intersection-over-its-own-area < 0.30. ``round(fraction * eligible)`` of
them are chosen (one ``Generator.permutation`` draw over the eligible indices, only when
at least one is chosen) and their pasted copies are appended after the existing
instances, in ascending original order.

The pixels: the selected polygons are rasterised one by one into **one** mask (their
union), and the mirrored image is copied into a fresh clone of the destination wherever
the mask is set. Pasting instance by instance writes, at every covered coordinate, the
very same source value (the source never changes), so the result is byte-identical; the
union only avoids writing a coordinate more than once. The tests keep the
instance-by-instance version to prove it.

Mixup mode (``copy_paste_mode="mixup"``, Ultralytics' behaviour, our code): applied with
probability ``copy_paste`` to a sample that has polygons; the source is a random partner
record through mosaic and the affine (no copy-paste of its own), drawn from the sample's
generator. A partner instance is eligible when it has a polygon and overlaps every existing
box by intersection over that box's area < 0.30; the eligible ones are taken in ascending
order of their largest such overlap (ties in instance order), ``round(fraction * eligible)``
of them, appended in that order. The kernel pastes the partner's layer under the union of
their polygons (``kernel.py`` step 2).
"""

from __future__ import annotations

import numpy as np

from ...shared.stream.rng import Draws
from .labels import Labels

IOA_MAX = 0.30


def _cv2():
    """OpenCV, imported on first use: on the route only copy-paste's polygon rasterisation
    needs it, so a worker that renders without copy-paste never loads it."""
    import cv2

    return cv2


def ioa(boxes1: np.ndarray, boxes2: np.ndarray) -> np.ndarray:
    """(n, m) intersection over the area of each box in ``boxes1``."""
    x1 = np.maximum(boxes1[:, None, 0], boxes2[None, :, 0])
    y1 = np.maximum(boxes1[:, None, 1], boxes2[None, :, 1])
    x2 = np.minimum(boxes1[:, None, 2], boxes2[None, :, 2])
    y2 = np.minimum(boxes1[:, None, 3], boxes2[None, :, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area = (boxes1[:, 2] - boxes1[:, 0]) * (boxes1[:, 3] - boxes1[:, 1])
    return inter / (area[:, None] + np.float32(1e-7))


def select(labels: Labels, flipped: Labels, fraction: float, rng: Draws | np.random.Generator) -> np.ndarray:
    """int64 indices of the instances to paste, ascending."""
    n = len(labels)
    if n == 0 or fraction <= 0:
        return np.zeros(0, dtype=np.int64)
    overlap = ioa(flipped.boxes, labels.boxes)
    eligible = np.flatnonzero((overlap < IOA_MAX).all(axis=1) & labels.has_polygons)
    k = int(round(fraction * len(eligible)))
    if k == 0:
        return np.zeros(0, dtype=np.int64)
    return np.sort(rng.permutation(eligible)[:k]).astype(np.int64)


def rasterise(mask: np.ndarray, polygon: np.ndarray) -> None:
    """Set ``mask`` (uint8) to 1 inside ``polygon`` (pixel x, y), in place."""
    _cv2().fillPoly(mask, [np.round(polygon).astype(np.int32)], 1)


def union_mask(
    shape_hw: tuple[int, int], polygons: list[np.ndarray]
) -> tuple[np.ndarray, tuple[int, int, int, int] | None]:
    """(uint8 mask, its bounding box (x0, y0, x1, y1) or None when empty): the selected
    polygons rasterised one by one into one mask."""
    mask = np.zeros(shape_hw, dtype=np.uint8)
    for polygon in polygons:
        rasterise(mask, polygon)
    if not polygons:
        return mask, None
    x, y, w, h = _cv2().boundingRect(mask)
    return mask, ((x, y, x + w, y + h) if w and h else None)


def paste_masked(
    dest: np.ndarray,
    window: np.ndarray | None,
    mask: np.ndarray,
    bbox: tuple[int, int, int, int] | None,
    *,
    in_place: bool = False,
) -> np.ndarray:
    """A fresh clone of ``dest`` (``dest`` itself with ``in_place``) with ``window`` (the
    source's pixels inside ``bbox``) copied where ``mask`` is set."""
    out = dest if in_place else dest.copy()
    if bbox is not None:
        x0, y0, x1, y1 = bbox
        # OpenCV writes through the ROI view of ``out`` (the tests check the result).
        _cv2().copyTo(window, mask[y0:y1, x0:x1], dst=out[y0:y1, x0:x1])
    return out


def paste_union(dest: np.ndarray, source: np.ndarray, polygons: list[np.ndarray]) -> np.ndarray:
    """A fresh clone of ``dest`` with ``source`` copied once inside the union of ``polygons``."""
    mask, bbox = union_mask(dest.shape[:2], polygons)
    window = None if bbox is None else source[bbox[1] : bbox[3], bbox[0] : bbox[2]]
    return paste_masked(dest, window, mask, bbox)


def flipped_pasted(labels: Labels, imgsz: int, fraction: float, rng: Draws | np.random.Generator) -> Labels | None:
    """The mirrored instances flip mode pastes into ``labels`` on an S x S image, in paste order, or
    None when none is chosen: the draws and the selection of copy-paste."""
    if len(labels) == 0 or fraction <= 0:
        return None
    flipped = labels.flipped(imgsz, imgsz, horizontal=True)
    chosen = select(labels, flipped, fraction, rng)
    if len(chosen) == 0:
        return None
    return flipped.select(chosen)


def select_partner(labels: Labels, partner: Labels, fraction: float) -> np.ndarray:
    """int64 indices of ``partner``'s instances to paste into ``labels`` (mixup mode), in paste order."""
    if len(partner) == 0 or fraction <= 0:
        return np.zeros(0, dtype=np.int64)
    if len(labels) == 0:
        return np.zeros(0, dtype=np.int64)  # the route only pastes into a sample with polygons
    overlap = ioa(labels.boxes, partner.boxes).T  # (partner, own): over each own box's area
    worst = overlap.max(axis=1)
    free = (overlap < IOA_MAX).all(axis=1)
    eligible = np.flatnonzero(free & partner.has_polygons)
    eligible = eligible[np.argsort(worst[eligible], kind="stable")]
    return eligible[: int(round(fraction * len(eligible)))].astype(np.int64)


def copy_paste(
    image: np.ndarray, labels: Labels, fraction: float, rng: Draws | np.random.Generator, *, in_place: bool = False
) -> tuple[np.ndarray, Labels]:
    """(new image, labels with the pasted instances appended) for a square float image;
    ``image`` is not written, unless ``in_place``. The standalone form of what the route
    does inside the kernel (same draws, same pixels).

    Only the part of the mirrored image under the mask's bounding box is built (nothing
    else of it is read), so mirroring costs the pasted area, not the whole image. That
    window is a copy taken before anything is pasted, so pasting in place reads no pixel
    it has already written.
    """
    pasted = flipped_pasted(labels, image.shape[1], fraction, rng)
    if pasted is None:
        return image, labels
    return paste_mirrored(image, pasted.polygons, in_place=in_place), Labels.concat([labels, pasted])


def paste_mirrored(image: np.ndarray, polygons: list[np.ndarray], *, in_place: bool = False) -> np.ndarray:
    """``image`` with its own left-right mirror copied once inside the union of ``polygons``
    (pixel coordinates in the mirrored frame): a fresh clone, or ``image`` itself with
    ``in_place``. The pixel step of ``copy_paste``; the tests swap it for an
    instance-by-instance version to prove the route's bytes unchanged."""
    h, w = image.shape[:2]
    mask, bbox = union_mask((h, w), polygons)
    window = None
    if bbox is not None:
        x0, y0, x1, y1 = bbox
        # The mirrored image's pixels in the box are the box's mirror image, flipped.
        window = _cv2().flip(image[y0:y1, w - x1 : w - x0], 1)
    return paste_masked(image, window, mask, bbox, in_place=in_place)
