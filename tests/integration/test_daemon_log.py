"""What the daemon logs at the default level: each thing an operator acts on, once.

A snapshot is said once with what it holds (also where the val split is the training images,
one snapshot for both); trainers are numbered 1, 2, ... whatever they validate (a validation
pass is a session of its own, said at debug level, never a trainer number); a daemon started
with a log file (how ``pixpool demo`` and ``pixpool yolo train``/``tune`` start theirs) writes its
log there and leaves only warnings and errors on the console.

Integration test: ``pixpool serve`` as a child process (``client/child.py``) over the synthetic
set; two ``fit`` runs of the tiny detector in this process on the CPU, one after the other.
"""

from __future__ import annotations

import re

from helpers.daemon import WAIT_S
from pixpool.client.child import serve_child
from pixpool.client.options import ClientOptions
from pixpool.client.train.fit import FitConfig, fit
from pixpool.shared.stream.config import AugmentConfig, DaemonConfig, StreamSettings
from pixpool.shared.stream.flags import to_argv
from pixpool.shared.transport.store import DEFAULT

IMGSZ = 64


def _run(tmp_path, name: str, epochs: int) -> FitConfig:
    return FitConfig(
        epochs=epochs,
        scale="tiny",
        project=str(tmp_path / name),
        progress=False,
        val_batch_size=4,
        device="cpu",
        stream=StreamSettings(seed=epochs, batch_size=8, augment=AugmentConfig(imgsz=IMGSZ)),
    )


def test_the_daemon_says_each_thing_once_and_numbers_trainers_1_2(synthetic_data, tmp_path, capfd):
    before = set(DEFAULT.segments())
    log_file = tmp_path / "daemon.log"
    serve = to_argv(DaemonConfig(data=str(synthetic_data.data_yaml), imgsz=IMGSZ, workers=1, processes=1))
    with serve_child(serve, timeout_s=WAIT_S, log_file=log_file) as (_, sdir, status):
        assert status.splits["val"].name == status.splits["train"].name  # val: the train images
        # Trainer 1 validates three times (the probe at start, then after each epoch); trainer 2 twice.
        fit(_run(tmp_path, "a", 2), ClientOptions(socket_dir=sdir, timeout_s=WAIT_S))
        fit(_run(tmp_path, "b", 1), ClientOptions(socket_dir=sdir, timeout_s=WAIT_S))
    console = capfd.readouterr().err
    log = log_file.read_text()
    lines = log.splitlines()
    assert " INFO " not in console and "pixpool.server.daemon" not in console, console
    # The snapshot once, with what it holds; the val split's sharing of it is no second line.
    said = [line for line in lines if re.search(r"snapshot \S+ (prepared|re-attached)", line)]
    assert len(said) == 1 and "training snapshot" in said[0] and "24 records" in said[0], log
    assert re.search(r"(uint8|float32) at 64 px, [\d.]+ MiB in ", said[0]), said[0]
    assert not [line for line in lines if "label index for" in line or "open-file limit" in line], log
    # Validation passes are no trainer and no default-level line.
    assert not [line for line in lines if "validation stream" in line or "validation pass" in line], log
    assert re.findall(r"trainer (\d+) attached", log) == ["1", "2"], log
    assert re.findall(r"trainer (\d+) detached", log) == ["1", "2"], log
    assert len(re.findall(r"daemon \d+ serving", log)) == 1 and len(re.findall(r"daemon \d+ stopped", log)) == 1
    assert set(DEFAULT.segments()) - before == set()
