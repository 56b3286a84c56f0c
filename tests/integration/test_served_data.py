"""A trainer that names its data trains on that data or not at all.

Integration tests: a spawned daemon serves dataset A (the synthetic set); dataset B is another
synthetic set with the same class names, other images and another image count. A trainer
that names B (``attach(data=)``, ``pixpool train --data``, ``pixpool digest DATA
--socket-dir``) must be refused with both datasets named, not handed A's batches; one that
names A, in any spelling (the data.yaml, its images folder), trains as before.
"""

from __future__ import annotations

import pytest

from helpers.daemon import WAIT_S, real_daemon
from pixpool.cli import main
from pixpool.client import attach
from pixpool.shared.errors import DatasetMismatchError

IMGSZ = 64


@pytest.fixture(scope="module")
def other_data(tmp_path_factory):
    """Dataset B: the same class names as the synthetic set, other images, 12 instead of 24."""
    from pixpool.server.synthetic import write_synthetic

    return write_synthetic(tmp_path_factory.mktemp("other"), num_images=12, seed=1)


@pytest.fixture(scope="module")
def daemon_on_a(synthetic_data):
    with real_daemon(synthetic_data.data_yaml, imgsz=IMGSZ, workers=1) as (_, d):
        yield d


def test_attach_refuses_a_daemon_serving_another_dataset(daemon_on_a, synthetic_data, other_data):
    with pytest.raises(DatasetMismatchError) as caught:
        attach(daemon_on_a, data=other_data.data_yaml, batch_size=4, timeout_s=WAIT_S)
    text = str(caught.value)
    # Both datasets by their resolved train split, where the daemon is, and what to do.
    assert str(other_data.images_dir) in text and str(synthetic_data.images_dir) in text, text
    assert daemon_on_a in text and "socket" in text and "stop" in text, text
    # The refused trainer left no ring behind (it detached before raising).
    from helpers.daemon import ask_status

    assert ask_status(daemon_on_a)["trainers"] == []


def test_attach_takes_the_same_dataset_in_any_spelling(daemon_on_a, synthetic_data):
    for spelling in (synthetic_data.data_yaml, synthetic_data.images_dir):
        with attach(daemon_on_a, data=spelling, batch_size=4, timeout_s=WAIT_S) as loader:
            assert loader.client.num_records == synthetic_data.num_images
            images, _ = next(iter(loader))
            assert images.shape == (4, 3, IMGSZ, IMGSZ)


def test_attach_refuses_another_task(daemon_on_a, synthetic_data):
    with pytest.raises(DatasetMismatchError, match="task segment.*task detect"):
        attach(daemon_on_a, data=synthetic_data.data_yaml, task="segment", batch_size=4, timeout_s=WAIT_S)


def test_pixpool_train_refuses_another_dataset(daemon_on_a, other_data, synthetic_data, tmp_path, capsys):
    argv = ["train", "--socket-dir", daemon_on_a, "--timeout-s", str(WAIT_S), "--no-progress", "--model", "tiny"]
    argv += ["--imgsz", str(IMGSZ), "--batch-size", "4", "--max-steps", "1", "--project", str(tmp_path / "runs")]
    assert main([*argv, "--data", str(other_data.data_yaml)]) == 1
    err = capsys.readouterr().err
    assert str(other_data.images_dir) in err and str(synthetic_data.images_dir) in err, err
    # The data the daemon serves, named: trains (and validates on the yaml's val:, checked too).
    assert main([*argv, "--epochs", "1", "--json", "--data", str(synthetic_data.data_yaml)]) == 0


def test_digest_of_a_running_daemon_refuses_another_dataset(daemon_on_a, other_data, synthetic_data, capsys):
    argv = ["digest", str(other_data.data_yaml), "--socket-dir", daemon_on_a, "--batches", "1", "--batch-size", "2"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert str(other_data.images_dir) in err and str(synthetic_data.images_dir) in err, err
    assert main([*argv[:1], str(synthetic_data.data_yaml), *argv[2:]]) == 0


def _relabelled(root, synthetic_data, *, own_labels: bool):
    """v2 of the synthetic set without copying pixels: ``images`` a symlink to the set's, the
    same data.yaml, and either labels of its own (every instance class 7) or ``labels`` a symlink too."""
    root.mkdir()
    (root / "images").symlink_to(synthetic_data.images_dir.parent)
    if own_labels:
        (root / "labels" / "train").mkdir(parents=True)
        for label in synthetic_data.labels_dir.iterdir():
            lines = [" ".join(["7", *line.split()[1:]]) for line in label.read_text().splitlines() if line.strip()]
            (root / "labels" / "train" / label.name).write_text("".join(f"{line}\n" for line in lines))
    else:
        (root / "labels").symlink_to(synthetic_data.labels_dir.parent)
    (root / "data.yaml").write_text(synthetic_data.data_yaml.read_text())
    return root / "data.yaml"


def test_a_relabelled_set_over_the_same_images_is_refused(daemon_on_a, synthetic_data, tmp_path, capsys):
    """v2's images are v1's (a symlink), its labels its own: the daemon serving v1 would hand v2's
    trainer v1's classes. Refused, naming the labels; a v2 that links the labels too is v1."""
    from helpers.daemon import ask_status

    v2 = _relabelled(tmp_path / "v2", synthetic_data, own_labels=True)
    with pytest.raises(DatasetMismatchError) as caught:
        attach(daemon_on_a, data=v2, batch_size=4, timeout_s=WAIT_S)
    assert "label" in str(caught.value), str(caught.value)
    assert ask_status(daemon_on_a)["trainers"] == []
    argv = ["digest", str(v2), "--socket-dir", daemon_on_a, "--batches", "1", "--batch-size", "2"]
    assert main(argv) == 1 and "label" in capsys.readouterr().err
    same = _relabelled(tmp_path / "v3", synthetic_data, own_labels=False)
    with attach(daemon_on_a, data=same, batch_size=4, timeout_s=WAIT_S) as loader:
        assert loader.client.num_records == synthetic_data.num_images
