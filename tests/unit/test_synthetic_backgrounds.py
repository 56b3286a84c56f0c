"""The synthetic set's image without a label file is a background by design: its data.yaml
says so, and reading it gives no warning (a new user's first command warned about it). An
image without labels that the data.yaml does not declare is still warned about."""

from __future__ import annotations

import logging

from pixpool.server.readers import ReaderStats, log_missing_labels
from pixpool.server.synthetic import write_synthetic


def _said(caplog, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level and "no label file" in r.getMessage()]


def test_the_synthetic_sets_background_without_labels_is_not_a_warning(tmp_path, caplog):
    from pixpool.server.snapshot.load import read_split, splits
    from pixpool.shared.stream.config import DaemonConfig

    caplog.set_level(logging.INFO, logger="pixpool.server.readers")
    for task in ("detect", "pose", "obb"):
        caplog.clear()
        data = write_synthetic(tmp_path / task, num_images=12, seed=0, task=task)
        config = DaemonConfig(data=str(data.data_yaml), task=task)
        warned: set = set()
        for request in splits(config).values():
            read_split(request, config.prepare_options(), warned=warned)
        assert _said(caplog, logging.WARNING) == [], (task, _said(caplog, logging.WARNING))
        told = _said(caplog, logging.INFO)
        assert len(told) == 1 and "1 of 12 images have no label file" in told[0] and "by design" in told[0], told


def test_an_undeclared_image_without_labels_is_still_warned(tmp_path, caplog):
    data = write_synthetic(tmp_path / "ds", num_images=12, seed=0)
    caplog.set_level(logging.INFO, logger="pixpool.server.readers")
    stats = ReaderStats(records=12, labels_missing=2, missing_label_example="labels/train/synth_0001.txt")
    log_missing_labels(stats, data.data_yaml)  # one more than the data.yaml declares
    warned = _said(caplog, logging.WARNING)
    assert len(warned) == 1 and "2 of 12 images have no label file" in warned[0]
    assert "declares 1" in warned[0]
