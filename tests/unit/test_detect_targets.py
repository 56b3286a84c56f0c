"""Host-side padding of packed target rows to fixed shapes."""

from __future__ import annotations

import numpy as np
import pytest

from pixpool.client.train.detect import pad_targets
from pixpool.shared.errors import CapacityError, ConfigError


def test_rows_fill_each_images_first_slots_in_order():
    rows = np.array(
        [
            [2, 1, 0.5, 0.5, 0.2, 0.2],
            [0, 3, 0.1, 0.2, 0.3, 0.4],
            [2, 0, 0.9, 0.9, 0.1, 0.1],
            [0, 4, 0.5, 0.6, 0.7, 0.8],
        ],
        np.float32,
    )
    targets, mask = pad_targets(rows, 4, 3)
    assert targets.shape == (4, 3, 5) and targets.dtype == np.float32 and mask.shape == (4, 3) and mask.dtype == bool
    np.testing.assert_array_equal(mask, [[1, 1, 0], [0, 0, 0], [1, 1, 0], [0, 0, 0]])
    np.testing.assert_array_equal(targets[0, :2], rows[[1, 3], 1:])
    np.testing.assert_array_equal(targets[2, :2], rows[[0, 2], 1:])
    assert not targets[~mask].any()


def test_empty_batch_gives_an_empty_mask():
    targets, mask = pad_targets(np.zeros((0, 6), np.float32), 2, 5)
    assert targets.shape == (2, 5, 5) and not mask.any() and not targets.any()


def test_exactly_max_targets_fits():
    rows = np.tile(np.array([[1, 0, 0.5, 0.5, 0.1, 0.1]], np.float32), (4, 1))
    _, mask = pad_targets(rows, 2, 4)
    assert mask[1].all() and not mask[0].any()


def test_overflow_names_the_file_the_count_and_the_fix():
    rows = np.array([[1, 0, 0.5, 0.5, 0.1, 0.1]] * 5 + [[0, 0, 0.5, 0.5, 0.1, 0.1]], np.float32)
    with pytest.raises(CapacityError) as err:
        pad_targets(rows, 2, 4, files=["a.jpg", "crowd.jpg"])
    text = str(err.value)
    assert (
        "'crowd.jpg'" in text
        and "5 boxes" in text
        and "max_targets=4" in text
        and "raise max_targets to at least 5" in text
    )


def test_overflow_without_files_names_the_batch_index():
    rows = np.array([[3, 0, 0.5, 0.5, 0.1, 0.1]] * 3, np.float32)
    with pytest.raises(CapacityError, match="batch index 3 has 3 boxes"):
        pad_targets(rows, 4, 2)


def test_batch_index_out_of_range_is_refused():
    with pytest.raises(ConfigError, match="batch has 2 images"):
        pad_targets(np.array([[2, 0, 0.5, 0.5, 0.1, 0.1]], np.float32), 2, 4)
