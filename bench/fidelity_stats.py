"""Fidelity statistics: per-image figures of a training stream and two-sample comparisons.

Pure numpy; imports neither pixpool nor Ultralytics, so both arms of ``bench/fidelity.py``
(pixpool's venv and the Ultralytics venv, ``bench/_ultralytics_arm.py``) compute their
figures with the very same functions, and ``tests/unit/test_fidelity_stats.py`` checks them
on known inputs.

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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# The fill as a uint8 pixel value. A literal, not pixpool's FILL_VALUE: this module also runs
# in the Ultralytics arm's venv (bench/_ultralytics_arm.py), where pixpool need not be
# installed; tests/unit/test_fidelity_stats.py checks that the two agree.
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


def batch_figures(images: np.ndarray, image_index: np.ndarray, boxes_cxcywh: np.ndarray) -> dict[str, np.ndarray]:
    """Per-image and per-box figures of one batch (see module docstring)."""
    images = np.asarray(images)
    if images.ndim != 4 or images.shape[1] != 3 or images.dtype != np.uint8:
        raise ValueError(f"images must be uint8 (B, 3, S, S), got {images.dtype} {images.shape}")
    b = images.shape[0]
    image_index = np.asarray(image_index, dtype=np.int64).ravel()
    boxes = np.asarray(boxes_cxcywh, dtype=np.float64).reshape(-1, 4)
    if image_index.size != boxes.shape[0]:
        raise ValueError(f"{image_index.size} image indices for {boxes.shape[0]} boxes")
    if image_index.size and (image_index.min() < 0 or image_index.max() >= b):
        raise ValueError(f"image indices must lie in 0..{b - 1}, got {image_index.min()}..{image_index.max()}")
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
    test: str  # "KS" or "mean"
    a: float  # summary of arm a (mean of its values)
    b: float
    statistic: float  # KS D, or |mean difference|
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
        diff = f"D = {r.statistic:.3f}" if r.test == "KS" else f"{r.statistic:.4g}"
        lines.append(
            f"| {r.metric} | {r.test} | {r.a:.4g} | {r.b:.4g} | {diff} | {r.tolerance:.4g} | {r.n_a} / {r.n_b} | {'yes' if r.passed else '**no**'} |"
        )
    return "\n".join(lines)
