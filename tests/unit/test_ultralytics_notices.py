"""What ``pixpool yolo train`` says at start: which daemon, and the albumentations difference."""

from __future__ import annotations

from pixpool.integrations.ultralytics import notices
from pixpool.shared.wire.status import Status

STATUS = {
    "daemon": {"pid": 4242},
    "snapshot": {"name": "pixpool-abc", "records": 128, "imgsz": 320, "task": "detect"},
    "workers": [{"index": 0}, {"index": 1}],
}


def test_the_daemon_line_names_socket_pid_snapshot_workers_imgsz_and_task():
    line = notices.daemon_line(Status.from_wire(STATUS), socket="/run/px/pixpool.sock", started=False)
    assert line.startswith("pixpool: using the running daemon 4242 at /run/px/pixpool.sock")
    for part in ("snapshot pixpool-abc", "128 records", "imgsz 320", "task detect", "2 workers", "keeps running"):
        assert part in line, (part, line)
    line = notices.daemon_line(Status.from_wire(STATUS), socket="/tmp/s/pixpool.sock", started=True)
    assert line.startswith("pixpool: started daemon 4242 at /tmp/s/pixpool.sock") and "stops when training ends" in line


def test_a_status_without_fields_still_gives_a_line():
    assert "snapshot ?" in notices.daemon_line(None, socket="/s", started=False)


def test_the_albumentations_line_only_where_the_package_is_importable():
    line = notices.albumentations_line(find_spec=lambda name: object())
    assert line == notices.ALBUMENTATIONS_LINE
    assert "Blur, MedianBlur, ToGray, CLAHE at p=0.01 each" in line and "pixpool's stream does not" in line
    assert notices.albumentations_line(find_spec=lambda name: None) is None

    def broken(name):
        raise ValueError("albumentations.__spec__ is None")

    assert notices.albumentations_line(find_spec=broken) is None
