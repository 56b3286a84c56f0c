"""The fidelity statistics (bench/_fidelity_stats.py, pure numpy) on inputs with known answers.

bench/_fidelity.py compares pixpool's stream with Ultralytics' loader through these
functions; both arms compute their figures with ``batch_figures``. Starts no process.
"""

from __future__ import annotations

import math

import _fidelity_stats as fs  # bench/, on sys.path by conftest.py
import numpy as np
import pytest


def test_ks_statistic_is_the_largest_gap_between_the_empirical_cdfs():
    assert fs.ks_statistic([1, 2, 3], [1, 2, 3]) == 0.0
    assert fs.ks_statistic([1, 2, 3], [4, 5, 6]) == 1.0
    # At x = 1 the CDFs are 1/3 and 0; everywhere else the gap is at most 1/3.
    assert fs.ks_statistic([1, 2, 3], [2, 3, 4]) == pytest.approx(1 / 3)
    # Ties across the samples: at x = 2 the CDFs are 1.0 and 0.5.
    assert fs.ks_statistic([1, 2], [2, 3]) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="non-empty"):
        fs.ks_statistic([], [1.0])


def test_ks_critical_value_matches_the_tabulated_coefficients():
    # c(0.05) = 1.358, c(0.01) = 1.628, c(0.001) = 1.949 (Smirnov's asymptotic table).
    assert fs.ks_critical(100, 100, 0.05) == pytest.approx(1.358 * math.sqrt(2 / 100), rel=1e-3)
    assert fs.ks_critical(256, 512, 0.01) == pytest.approx(1.628 * math.sqrt(768 / (256 * 512)), rel=1e-3)
    assert fs.ks_critical(10, 10, 0.001) == pytest.approx(1.949 * math.sqrt(0.2), rel=1e-3)
    with pytest.raises(ValueError):
        fs.ks_critical(0, 10, 0.05)


def test_normal_quantile_and_mean_tolerance():
    assert fs.normal_quantile(0.975) == pytest.approx(1.959964, abs=1e-5)
    assert fs.normal_quantile(0.9995) == pytest.approx(3.290527, abs=1e-5)
    a = np.array([0.0, 2.0, 4.0, 6.0])  # variance (ddof 1) 20/3
    b = np.array([1.0, 1.0, 3.0, 3.0])  # variance 4/3
    se = math.sqrt((20 / 3) / 4 + (4 / 3) / 4)
    assert fs.mean_tolerance(a, b, 0.05) == pytest.approx(1.959964 * se, rel=1e-5)


def test_batch_figures_count_fill_pixels_boxes_and_channel_moments():
    images = np.zeros((2, 3, 4, 4), np.uint8)
    images[0] = 114  # all fill
    images[1, :, :2, :] = 114  # top half fill ...
    images[1, 2, 0, 0] = 0  # ... but one pixel with blue 0 is not fill
    images[1, 0, 2:, :] = 200
    idx = np.array([1, 1, 1])
    boxes = np.array([[0.5, 0.5, 0.2, 0.4], [0.1, 0.1, 0.1, 0.1], [0.3, 0.3, 0.6, 0.05]])
    f = fs.batch_figures(images, idx, boxes)
    assert f["boxes_per_image"].tolist() == [0.0, 3.0]
    assert f["fill_share"].tolist() == [1.0, 7 / 16]
    assert f["mean"][0].tolist() == [114.0, 114.0, 114.0]
    assert f["mean"][1, 0] == pytest.approx((8 * 114 + 8 * 200) / 16)
    assert f["std"][0].tolist() == [0.0, 0.0, 0.0]
    assert f["std"][1, 0] == pytest.approx(43.0)  # half 114, half 200
    assert f["box_w"].tolist() == [0.2, 0.1, 0.6]
    assert f["box_h"].tolist() == [0.4, 0.1, 0.05]
    with pytest.raises(ValueError, match="image indices"):
        fs.batch_figures(images, np.array([2]), boxes[:1])
    with pytest.raises(ValueError, match="uint8"):
        fs.batch_figures(images.astype(np.float32), idx, boxes)


def test_hue_shift_wraps_around_the_hue_circle():
    before = np.array([179, 10, 0, 90], np.uint8)
    after = np.array([1, 8, 178, 90], np.uint8)
    assert fs.hue_shift(before, after, np.ones(4, bool)) == pytest.approx((2 - 2 - 2 + 0) / 4)
    assert fs.hue_shift(before, after, np.array([True, False, False, False])) == 2.0
    assert math.isnan(fs.hue_shift(before, after, np.zeros(4, bool)))


def test_compare_passes_the_same_distribution_and_fails_a_shifted_one():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=2000), rng.normal(size=2000)
    assert fs.compare_ks("same", a, b, 0.001).passed
    assert fs.compare_mean("same", a, b, 0.001).passed
    shifted = b + 0.3
    assert not fs.compare_ks("shifted", a, shifted, 0.001).passed
    assert not fs.compare_mean("shifted", a, shifted, 0.001).passed
    # Judged at fewer independent units, the same gap is within tolerance.
    assert fs.compare_ks("clustered", a, shifted, 0.001, unit_sizes=(20, 20)).passed


def test_markdown_table_has_one_row_per_comparison():
    rows = [
        fs.compare_mean("ok", [1.0, 2.0, 3.0], [1.0, 2.0, 3.0], 0.01),
        fs.compare_ks("off", [0.0, 0.1, 0.2], [5.0, 5.1, 5.2], 0.5),
    ]
    text = fs.markdown(rows)
    lines = text.splitlines()
    assert len(lines) == 4
    assert lines[2].startswith("| ok | mean |") and lines[2].endswith("| yes |")
    assert lines[3].startswith("| off | KS |") and "D = 1.000" in lines[3] and lines[3].endswith("| **no** |")


def test_the_fill_the_statistics_count_is_pixpools():
    from pixpool.shared.stream.config import FILL_VALUE

    assert fs.FILL == FILL_VALUE


# -- masks, keypoints, angles -------------------------------------------------------------
def test_polygon_mask_fills_the_pixels_whose_centres_are_inside():
    square = np.array([[2.0, 3.0], [6.0, 3.0], [6.0, 5.0], [2.0, 5.0]])
    mask = fs.polygon_mask(square, 10)
    expected = np.zeros((10, 10), bool)
    expected[3:5, 2:6] = True  # centres 2.5..5.5 in x, 3.5..4.5 in y
    assert np.array_equal(mask, expected)
    # A triangle: the even-odd rule keeps the pixels below the diagonal only.
    tri = fs.polygon_mask(np.array([[0.0, 0.0], [8.0, 8.0], [0.0, 8.0]]), 8)
    assert tri.sum() == 28 and tri[7, 0] and not tri[0, 7]
    assert not fs.polygon_mask(np.array([[1.0, 1.0], [2.0, 2.0]]), 4).any()  # fewer than 3 points


def test_a_mask_exactly_its_polygon_scores_iou_1_and_a_shifted_one_less():
    poly = np.array([[10.0, 12.0], [30.0, 8.0], [34.0, 28.0], [14.0, 30.0]])
    mask = fs.polygon_mask(poly, 40)
    assert fs.mask_iou(mask, fs.polygon_mask(poly, 40)) == 1.0
    shifted = fs.polygon_mask(poly + [3.0, 0.0], 40)
    assert 0.5 < fs.mask_iou(mask, shifted) < 1.0
    assert fs.mask_iou(mask, fs.polygon_mask(poly + [25.0, 0.0], 64)[:40, :40]) < 0.2
    assert fs.mask_iou(np.zeros((4, 4)), np.zeros((4, 4))) == 0.0
    with pytest.raises(ValueError, match="one shape"):
        fs.mask_iou(np.zeros((4, 4)), np.zeros((5, 5)))


def test_mask_figures_pair_each_instance_with_its_own_row():
    side = 20
    plane = np.zeros((2, side, side), np.uint8)
    plane[0, 2:12, 2:12] = 1  # image 0, row 0: a 10x10 square, exactly its box
    plane[0, 14:18, 14:16] = 2  # image 0, row 1: 4 high, 2 wide, exactly its box
    boxes = np.array([[7 / side, 7 / side, 10 / side, 10 / side], [15 / side, 16 / side, 2 / side, 4 / side]])
    f = fs.mask_figures(plane, np.array([0, 0]), boxes)
    assert f["mask_coverage"].tolist() == [108 / 400, 0.0]
    assert f["mask_area"].tolist() == [100 / 400, 8 / 400]
    assert f["mask_box_iou"].tolist() == [1.0, 1.0]
    # The same masks with the rows swapped: each mask now sits outside its box.
    swapped = fs.mask_figures(plane, np.array([0, 0]), boxes[::-1])
    assert swapped["mask_box_iou"].max() < 0.1
    with pytest.raises(ValueError, match="image order"):
        fs.mask_figures(plane, np.array([1, 0]), boxes)
    with pytest.raises(ValueError, match="overlap planes"):
        fs.mask_figures(plane[0], np.array([0, 0]), boxes)


def test_keypoint_figures_count_visible_points_and_place_them_in_their_box():
    boxes = np.array([[0.5, 0.5, 0.4, 0.2], [0.2, 0.2, 0.2, 0.2]])  # first box spans x 0.3..0.7, y 0.4..0.6
    kpts = np.array(
        [
            [[0.3, 0.4, 2.0], [0.7, 0.6, 1.0], [0.0, 0.0, 0.0]],
            [[0.2, 0.2, 2.0], [0.9, 0.9, 0.0], [0.1, 0.3, 2.0]],
        ]
    )
    f = fs.keypoint_figures(kpts, boxes)
    assert f["kpt_visible"].tolist() == [2.0, 2.0]
    np.testing.assert_allclose(f["kpt_rel_x"], [0.0, 1.0, 0.5, 0.0])
    np.testing.assert_allclose(f["kpt_rel_y"], [0.0, 1.0, 0.5, 1.0])
    np.testing.assert_allclose(f["kpt_rel_x_of"][:, 0], [0.0, 0.5])
    assert np.isnan(f["kpt_rel_x_of"][0, 2]) and np.isnan(f["kpt_rel_x_of"][1, 1])
    with pytest.raises(ValueError, match="visibility"):
        fs.keypoint_figures(kpts[..., :2], boxes)


def test_angle_histogram_distance_is_0_for_equal_samples_and_1_for_disjoint_ones():
    edges = np.linspace(0, math.pi / 2, 10)
    a = np.array([0.1, 0.2, 0.7, 1.2, 1.5])
    assert fs.histogram_distance(a, a.copy(), edges) == 0.0
    assert fs.histogram_distance(a, a[::-1], edges) == 0.0  # order does not matter
    assert fs.histogram_distance([0.05, 0.06], [1.5, 1.52], edges) == 1.0
    assert fs.histogram_distance([0.05, 1.5], [0.05, 0.06], edges) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="non-empty"):
        fs.histogram_distance([], a, edges)


def test_compare_histogram_passes_the_same_angles_and_fails_other_ones():
    rng = np.random.default_rng(1)
    edges = np.linspace(0, math.pi / 2, 19)

    def images(low, high, count):
        return [rng.uniform(low, high, size=int(rng.integers(1, 6))) for _ in range(count)]

    same = fs.compare_histogram("angle", images(0, math.pi / 2, 300), images(0, math.pi / 2, 300), edges, 0.001)
    assert same.passed and same.test == "hist" and same.n_a == 300
    other = fs.compare_histogram("angle", images(0, math.pi / 2, 300), images(0, math.pi / 4, 300), edges, 0.001)
    assert not other.passed and other.statistic > 0.3
    assert "TV = " in fs.markdown([other])


def _fake_arm(task: str, rng: np.random.Generator, images: int = 200, *, mirror_left: bool = False) -> dict:
    """Figures as bench/_fidelity.py's two arms return them, drawn from one known distribution."""
    per_image = rng.integers(1, 6, size=images)
    n = int(per_image.sum())
    arm = {
        "boxes_per_image": per_image.astype(np.float64),
        "fill_share": rng.uniform(0, 0.2, size=images),
        "box_w": rng.uniform(0.05, 0.4, size=n),
        "box_h": rng.uniform(0.05, 0.4, size=n),
    }
    if task == "segment":
        arm.update(
            mask_coverage=rng.uniform(0.1, 0.5, size=images),
            mask_area=rng.uniform(0.001, 0.05, size=n),
            mask_box_iou=rng.uniform(0.4, 0.9, size=n),
        )
    elif task == "pose":
        rel_x = np.stack([rng.normal(0.5, 0.05, n), rng.normal(0.8, 0.05, n), rng.normal(0.2, 0.05, n)], axis=1)
        if mirror_left:  # flips without flip_idx: half the "left hands" end up on the right
            swap = rng.uniform(size=n) < 0.5
            rel_x[swap, 1], rel_x[swap, 2] = rel_x[swap, 2].copy(), rel_x[swap, 1].copy()
        arm.update(
            kpt_visible=rng.integers(0, 4, size=n).astype(np.float64),
            kpt_rel_x=rel_x.ravel(),
            kpt_rel_y=rng.uniform(0, 1, size=3 * n),
            kpt_rel_x_of=rel_x,
        )
    else:
        arm.update(
            obb_angle=rng.uniform(0, math.pi / 2, size=n), obb_angle_image=np.repeat(np.arange(images), per_image)
        )
    return arm


@pytest.mark.parametrize("task", ["segment", "pose", "obb"])
def test_the_task_tables_pass_one_distribution_against_itself(task):
    import _fidelity as fidelity

    rng = np.random.default_rng(7)
    rows = fidelity.task_rows(task, _fake_arm(task, rng), _fake_arm(task, rng), 0.001)
    metrics = " ".join(r.metric for r in rows)
    assert {"segment": "mask IoU with its own box", "pose": "keypoint 1 x in its box", "obb": "angle histogram"}[
        task
    ] in metrics
    assert all(r.passed for r in rows), [r for r in rows if not r.passed]


def test_the_pose_table_catches_flips_that_ignore_flip_idx():
    import _fidelity as fidelity

    rng = np.random.default_rng(8)
    rows = fidelity.task_rows("pose", _fake_arm("pose", rng, mirror_left=True), _fake_arm("pose", rng), 0.001)
    failed = {r.metric for r in rows if not r.passed}
    assert {"keypoint 1 x in its box", "keypoint 2 x in its box"} <= failed
