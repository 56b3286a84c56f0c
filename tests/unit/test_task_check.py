"""An unknown task is one error wherever a task is taken: the ConfigError of
``shared.task.task_spec`` (also a ValueError), naming the field ``task``, the value and the tasks.
No processes; the readers refuse before they open a file."""

from __future__ import annotations

import pytest

from pixpool.server.readers import read_dataset
from pixpool.server.readers.coco import read_coco
from pixpool.server.readers.yolo import read_yolo_folder, read_yolo_yaml
from pixpool.server.synthetic import write_synthetic
from pixpool.shared.errors import ConfigError
from pixpool.shared.stream.config import TASKS, DaemonConfig, check_task
from pixpool.shared.stream.records import Dataset
from pixpool.shared.task import task_spec

PLACES = {
    "check_task": lambda tmp: check_task("classify"),
    "DaemonConfig": lambda tmp: DaemonConfig(data=str(tmp / "data.yaml"), task="classify"),
    "task_spec": lambda tmp: task_spec("classify"),
    "Dataset": lambda tmp: Dataset((), ("a",), (), spec=task_spec("classify")),
    "read_dataset": lambda tmp: read_dataset(tmp / "data.yaml", task="classify"),
    "read_yolo_yaml": lambda tmp: read_yolo_yaml(tmp / "data.yaml", task=task_spec("classify")),
    "read_yolo_folder": lambda tmp: read_yolo_folder(tmp / "images", task=task_spec("classify")),
    "read_coco": lambda tmp: read_coco(tmp / "instances.json", tmp / "images", task=task_spec("classify")),
    "write_synthetic": lambda tmp: write_synthetic(tmp / "synth", task="classify"),
}


@pytest.mark.parametrize("place", PLACES)
def test_an_unknown_task_is_the_one_config_error(place, tmp_path):
    with pytest.raises(ConfigError) as info:
        PLACES[place](tmp_path)
    assert isinstance(info.value, ValueError)
    assert info.value.field == "task" and info.value.value == "classify"
    assert str(info.value) == f"field 'task' = 'classify' is not one of the tasks; use one of {list(TASKS)} (--task)"
    assert not list(tmp_path.iterdir())  # refused before anything was read or written


def test_every_task_passes_and_a_non_string_is_refused():
    assert [check_task(t) for t in TASKS] == list(TASKS)
    with pytest.raises(ConfigError, match="field 'task' = 3 is not one of the tasks"):
        check_task(3)


def test_a_spec_is_its_own_spec_and_says_what_a_row_carries():
    assert all(task_spec(task_spec(t)) is task_spec(t) and task_spec(t).name == t for t in TASKS)
    assert {t: task_spec(t).target_width((17, 3)) for t in TASKS} == {"detect": 6, "segment": 6, "pose": 57, "obb": 7}
    assert [t for t in TASKS if task_spec(t).mask_side(640, 4)] == ["segment"]
    with pytest.raises(ValueError, match="the pose task needs kpt_shape"):
        task_spec("pose").target_width()
