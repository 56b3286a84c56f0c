"""Fidelity statistics: per-image figures of a training stream and two-sample comparisons.

Pure numpy; imports neither pixpool nor Ultralytics, so both arms of the fidelity comparison
(``bench/_fidelity.py`` in pixpool's venv, ``bench/_ultralytics_arm.py`` in the Ultralytics venv)
compute their figures with the very same functions, and ``bench/tests/test_fidelity_stats.py``
checks them on known inputs.

What one batch gives (``batch_figures``): images are uint8 (B, 3, S, S) RGB; boxes are
normalised (cx, cy, w, h) with the image index of each row. Per image: the number of boxes,
the share of fill pixels (all three channels exactly ``FILL``), each channel's mean and
standard deviation; per box: width and height (fractions of S).

How two streams are compared (``compare``), at significance ``alpha`` per metric:

- distributions: the two-sample Kolmogorov-Smirnov statistic D against its asymptotic
  critical value c(alpha) * sqrt((n + m) / (n m)), c(alpha) = sqrt(-ln(alpha / 2) / 2).
  For discrete data (boxes per image) the test is conservative (it rejects less often
  than alpha), so a pass there is weaker evidence, a fail is not.
- means: |mean_a - mean_b| against z(alpha) standard errors of the difference,
  sqrt(var_a / n + var_b / m) (Welch), z(alpha) the two-sided normal quantile.

Boxes are not independent (a mosaic's boxes share its scale; one photo's boxes come
together), so per-box distributions are judged at the number of *images* of each arm, the
independent unit, not the number of boxes (``unit_sizes``).

Per task (segment, pose, obb), from what a trainer receives and nothing else (neither arm's batch
carries the polygons any more), each arm computing with the same functions:

- masks (``mask_figures``): an overlap plane (M, M) per image, instance j of that image
  drawn as value j + 1 (the order of its target rows). Per image the coverage (share of
  non-zero pixels); per instance its area (share of the plane) and its agreement with its
  own box: the IoU of the mask with the box rasterised at mask size (``polygon_mask`` of the
  box's 4 corners). A mask paired with the wrong row, shifted or scaled against its box
  scores low; a correct one scores its shape's fill of the box, less what smaller instances
  drawn over it hide.
- keypoints (``keypoint_figures``): per instance the number of visible points (v > 0); per
  visible point its position relative to its box ((x - x1) / w, (y - y1) / h), all points
  together and per keypoint index (the latter shows whether ``flip_idx`` was applied: a
  "left hand" stays on its side of the box).
- angles (``histogram_distance``): the total-variation distance between the two arms'
  histograms of the angle, judged against the same distance between random splits of the
  pooled images (``compare_histogram``: a permutation test that moves whole images, the
  independent unit, not single boxes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# The fill as a uint8 pixel value. A literal, not pixpool's FILL_VALUE: this module also runs
# in the Ultralytics arm's venv (bench/_ultralytics_arm.py), where pixpool need not be
# installed; bench/tests/test_fidelity_stats.py checks that the two agree.
FILL = 114


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical CDFs."""
    a = np.sort(np.asarray(a, dtype=np.float64).ravel())
    b = np.sort(np.asarray(b, dtype=np.float64).ravel())
    if a.size == 0 or b.size == 0:
        raise ValueError(f"ks_statistic needs two non-empty samples, got {a.size} and {b.size} values")
    points = np.concatenate([a, b])
    cdf_a = np.searchsorted(a, points, side="right") / a.size
    cdf_b = np.searchsorted(b, points, side="right") / b.size
    return float(np.max(np.abs(cdf_a - cdf_b)))


def ks_critical(n: int, m: int, alpha: float) -> float:
    """Asymptotic critical value of the two-sample KS statistic at level ``alpha``."""
    if n <= 0 or m <= 0 or not 0 < alpha < 1:
        raise ValueError(f"ks_critical needs n, m > 0 and 0 < alpha < 1, got {n}, {m}, {alpha}")
    return math.sqrt(-math.log(alpha / 2) / 2) * math.sqrt((n + m) / (n * m))


def normal_quantile(p: float) -> float:
    """z with P(Z <= z) = p for a standard normal (bisection on erf; no scipy)."""
    if not 0 < p < 1:
        raise ValueError(f"normal_quantile needs 0 < p < 1, got {p}")
    lo, hi = -40.0, 40.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if 0.5 * (1 + math.erf(mid / math.sqrt(2))) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def mean_tolerance(a: np.ndarray, b: np.ndarray, alpha: float) -> float:
    """z(1 - alpha/2) standard errors of the difference of the two means (Welch)."""
    a, b = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    if a.size < 2 or b.size < 2:
        raise ValueError(f"mean_tolerance needs two samples of at least 2 values, got {a.size} and {b.size}")
    se = math.sqrt(a.var(ddof=1) / a.size + b.var(ddof=1) / b.size)
    return normal_quantile(1 - alpha / 2) * se


def _rows(image_index, boxes_cxcywh, b: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows of a batch of ``b`` images: (n,) image indices and (n, 4) boxes, checked."""
    image_index = np.asarray(image_index, dtype=np.int64).ravel()
    boxes = np.asarray(boxes_cxcywh, dtype=np.float64).reshape(-1, 4)
    if image_index.size != boxes.shape[0]:
        raise ValueError(f"{image_index.size} image indices for {boxes.shape[0]} boxes")
    if image_index.size and (image_index.min() < 0 or image_index.max() >= b):
        raise ValueError(f"image indices must lie in 0..{b - 1}, got {image_index.min()}..{image_index.max()}")
    return image_index, boxes


def batch_figures(images: np.ndarray, image_index: np.ndarray, boxes_cxcywh: np.ndarray) -> dict[str, np.ndarray]:
    """Per-image and per-box figures of one batch (see module docstring)."""
    images = np.asarray(images)
    if images.ndim != 4 or images.shape[1] != 3 or images.dtype != np.uint8:
        raise ValueError(f"images must be uint8 (B, 3, S, S), got {images.dtype} {images.shape}")
    b = images.shape[0]
    image_index, boxes = _rows(image_index, boxes_cxcywh, b)
    flat = images.reshape(b, 3, -1)
    fill = (flat == FILL).all(axis=1).mean(axis=1)
    mean = flat.mean(axis=2)
    std = flat.std(axis=2)
    return {
        "boxes_per_image": np.bincount(image_index, minlength=b).astype(np.float64),
        "fill_share": fill,
        "mean": mean,  # (B, 3) R G B
        "std": std,
        "box_w": boxes[:, 2].copy(),
        "box_h": boxes[:, 3].copy(),
    }


def polygon_mask(points_px: np.ndarray, side: int) -> np.ndarray:
    """bool (side, side): pixels whose centre lies inside the polygon (even-odd rule).

    ``points_px`` (k, 2) in mask pixels. Pure numpy, tested only against the pixels in the
    polygon's extent, so a small polygon on a large plane costs little."""
    pts = np.asarray(points_px, dtype=np.float64).reshape(-1, 2)
    out = np.zeros((side, side), dtype=bool)
    if len(pts) < 3:
        return out
    x0, y0 = (max(0, int(np.floor(v - 0.5))) for v in pts.min(axis=0))
    x1, y1 = (min(side, int(np.ceil(v + 0.5))) for v in pts.max(axis=0))
    if x1 <= x0 or y1 <= y0:
        return out
    px = np.arange(x0, x1, dtype=np.float64)[None, :] + 0.5
    py = np.arange(y0, y1, dtype=np.float64)[:, None] + 0.5
    inside = np.zeros((y1 - y0, x1 - x0), dtype=bool)
    ax, ay = pts[:, 0], pts[:, 1]
    bx, by = np.roll(ax, -1), np.roll(ay, -1)
    for xa, ya, xb, yb in zip(ax, ay, bx, by):
        if ya == yb:
            continue  # a horizontal edge never crosses a horizontal ray
        spans = (ya > py) != (yb > py)  # (rows, 1): the edge crosses this row's ray
        x_cross = xa + (py - ya) * (xb - xa) / (yb - ya)
        inside ^= spans & (px < x_cross)
    out[y0:y1, x0:x1] = inside
    return out


def mask_iou(a: np.ndarray, b: np.ndarray) -> float:
    """Intersection over union of two boolean masks of one shape; 0 when both are empty."""
    a, b = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    if a.shape != b.shape:
        raise ValueError(f"mask_iou needs masks of one shape, got {a.shape} and {b.shape}")
    union = int(np.count_nonzero(a | b))
    return int(np.count_nonzero(a & b)) / union if union else 0.0


def _box_corners(cxcywh: np.ndarray, side: int) -> np.ndarray:
    cx, cy, w, h = (float(v) * side for v in cxcywh)
    return np.array(
        [[cx - w / 2, cy - h / 2], [cx + w / 2, cy - h / 2], [cx + w / 2, cy + h / 2], [cx - w / 2, cy + h / 2]]
    )


def mask_figures(masks: np.ndarray, image_index: np.ndarray, boxes_cxcywh: np.ndarray) -> dict[str, np.ndarray]:
    """Per-image coverage and per-instance area and mask/box IoU of one segment batch.

    ``masks`` (B, M, M) overlap planes (instance j of image i, in row order, has value j + 1);
    rows of ``image_index`` / ``boxes_cxcywh`` (normalised) in image order, as both arms deliver."""
    masks = np.asarray(masks)
    if masks.ndim != 3 or masks.shape[1] != masks.shape[2]:
        raise ValueError(f"masks must be (B, M, M) overlap planes, got shape {masks.shape}")
    b, side = masks.shape[0], masks.shape[1]
    image_index, boxes = _rows(image_index, boxes_cxcywh, b)
    if np.any(np.diff(image_index) < 0):
        raise ValueError("rows must come in image order (both arms deliver them so)")
    area, iou = [], []
    for i in range(b):
        rows = np.flatnonzero(image_index == i)
        plane = masks[i]
        for j, row in enumerate(rows):
            mask = plane == j + 1
            area.append(np.count_nonzero(mask) / (side * side))
            iou.append(mask_iou(mask, polygon_mask(_box_corners(boxes[row], side), side)))
    return {
        "mask_coverage": (masks.reshape(b, -1) != 0).mean(axis=1),
        "mask_area": np.asarray(area, dtype=np.float64),
        "mask_box_iou": np.asarray(iou, dtype=np.float64),
    }


def keypoint_figures(keypoints: np.ndarray, boxes_cxcywh: np.ndarray) -> dict[str, np.ndarray]:
    """Per-instance visible count and per-visible-point position relative to its box.

    ``keypoints`` (n, K, 3) normalised x, y and visibility; ``boxes_cxcywh`` (n, 4) normalised.
    ``kpt_rel_x`` / ``kpt_rel_y`` hold every visible point; ``kpt_rel_x_of`` (n, K) the
    relative x per keypoint index, NaN where that point is not visible."""
    kpts = np.asarray(keypoints, dtype=np.float64)
    if kpts.ndim != 3 or kpts.shape[2] != 3:
        raise ValueError(f"keypoints must be (n, K, 3) x, y, visibility, got shape {kpts.shape}")
    boxes = np.asarray(boxes_cxcywh, dtype=np.float64).reshape(-1, 4)
    if boxes.shape[0] != kpts.shape[0]:
        raise ValueError(f"{kpts.shape[0]} keypoint instances for {boxes.shape[0]} boxes")
    visible = kpts[..., 2] > 0
    x1 = (boxes[:, 0] - boxes[:, 2] / 2)[:, None]
    y1 = (boxes[:, 1] - boxes[:, 3] / 2)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        rel_x = (kpts[..., 0] - x1) / boxes[:, 2:3]
        rel_y = (kpts[..., 1] - y1) / boxes[:, 3:4]
    return {
        "kpt_visible": visible.sum(axis=1).astype(np.float64),
        "kpt_rel_x": rel_x[visible],
        "kpt_rel_y": rel_y[visible],
        "kpt_rel_x_of": np.where(visible, rel_x, np.nan),
    }


def histogram_distance(a: np.ndarray, b: np.ndarray, edges: np.ndarray) -> float:
    """Total-variation distance (half the L1 distance) between the normalised histograms of
    ``a`` and ``b`` over ``edges``: 0 for equal samples, 1 for samples in disjoint bins."""
    a, b = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    if a.size == 0 or b.size == 0:
        raise ValueError(f"histogram_distance needs two non-empty samples, got {a.size} and {b.size} values")
    ha = np.histogram(np.clip(a, edges[0], edges[-1]), edges)[0] / a.size
    hb = np.histogram(np.clip(b, edges[0], edges[-1]), edges)[0] / b.size
    return 0.5 * float(np.abs(ha - hb).sum())


def compare_histogram(
    metric: str,
    a_by_image: list[np.ndarray],
    b_by_image: list[np.ndarray],
    edges: np.ndarray,
    alpha: float,
    *,
    rounds: int = 2000,
    seed: int = 0,
) -> Row:
    """Histogram distance row; the tolerance is the (1 - alpha) quantile of the distance between
    ``rounds`` random splits of the pooled images into groups of the two arms' sizes (whole
    images move, so instances that come together stay together)."""
    groups = [np.asarray(g, dtype=np.float64).ravel() for g in (*a_by_image, *b_by_image)]
    n, m = len(a_by_image), len(b_by_image)
    if n == 0 or m == 0:
        raise ValueError(f"compare_histogram needs images on both sides, got {n} and {m}")
    a, b = np.concatenate(groups[:n]), np.concatenate(groups[n:])
    observed = histogram_distance(a, b, edges)
    rng = np.random.default_rng(seed)
    lengths = np.array([g.size for g in groups])
    values = np.concatenate(groups)
    null = []
    for _ in range(rounds):
        in_a = np.zeros(n + m, dtype=bool)
        in_a[rng.permutation(n + m)[:n]] = True
        take = np.repeat(in_a, lengths)
        if take.all() or not take.any():
            continue
        null.append(histogram_distance(values[take], values[~take], edges))
    tolerance = float(np.quantile(null, 1 - alpha)) if null else 0.0
    return Row(metric, "hist", float(a.mean()), float(b.mean()), observed, tolerance, n, m)


def hue_shift(before_hsv_hue: np.ndarray, after_hsv_hue: np.ndarray, mask: np.ndarray) -> float:
    """Mean signed hue change over ``mask``, in OpenCV 8-bit hue levels (0..179, circular).

    Each difference is wrapped to [-90, 90) so that 179 -> 1 is +2, not -178.
    """
    d = after_hsv_hue.astype(np.int64) - before_hsv_hue.astype(np.int64)
    d = (d + 90) % 180 - 90
    sel = d[np.asarray(mask, dtype=bool)]
    return float(sel.mean()) if sel.size else float("nan")


def concat(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Join the figures of several batches key by key."""
    if not parts:
        raise ValueError("no batches to join")
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


@dataclass
class Row:
    metric: str
    test: str  # "KS", "mean" or "hist" (histogram distance, permutation tolerance)
    a: float  # summary of arm a (mean of its values)
    b: float
    statistic: float  # KS D, |mean difference|, or the histogram distance
    tolerance: float
    n_a: int
    n_b: int

    @property
    def passed(self) -> bool:
        return self.statistic <= self.tolerance


def compare_ks(
    metric: str, a: np.ndarray, b: np.ndarray, alpha: float, unit_sizes: tuple[int, int] | None = None
) -> Row:
    """KS row; ``unit_sizes`` are the independent units behind the values (default: their counts)."""
    a, b = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    n, m = unit_sizes or (a.size, b.size)
    return Row(metric, "KS", float(a.mean()), float(b.mean()), ks_statistic(a, b), ks_critical(n, m, alpha), n, m)


def compare_mean(metric: str, a: np.ndarray, b: np.ndarray, alpha: float) -> Row:
    a, b = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    return Row(
        metric,
        "mean",
        float(a.mean()),
        float(b.mean()),
        abs(float(a.mean() - b.mean())),
        mean_tolerance(a, b, alpha),
        a.size,
        b.size,
    )


def markdown(rows: list[Row], names: tuple[str, str] = ("pixpool", "ultralytics")) -> str:
    """The table: metric, test, each arm's mean, difference, tolerance, pass."""
    lines = [
        f"| metric | test | {names[0]} | {names[1]} | difference | tolerance | n | pass |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        diff = {"KS": f"D = {r.statistic:.3f}", "hist": f"TV = {r.statistic:.3f}"}.get(r.test, f"{r.statistic:.4g}")
        lines.append(
            f"| {r.metric} | {r.test} | {r.a:.4g} | {r.b:.4g} | {diff} | {r.tolerance:.4g} | {r.n_a} / {r.n_b} | {'yes' if r.passed else '**no**'} |"
        )
    return "\n".join(lines)
