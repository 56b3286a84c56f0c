"""The folder a training run writes into: the next free name, claimed when the run starts.

Runs in the trainer process (``fit``) and in the demo's process (its project folder).
As Ultralytics names its runs: ``runs/train`` when it does not exist, else ``runs/train2``,
``runs/train3``, ...; a new run never appends to another run's ``results.jsonl`` nor
overwrites its ``last.pt``/``best.pt``. ``exist_ok`` reuses the folder as it is.

The folder is made only once the run starts (after every check and the attach), so a
refused run leaves nothing behind; ``mkdir`` without ``exist_ok`` claims a name atomically,
so two runs started at once into one project get two folders. A run interrupted before
it saved anything gives its folder back (``release``), so Ctrl-C leaves no empty run behind.
"""

from __future__ import annotations

from pathlib import Path

from ...shared.errors import ConfigError

__all__ = ["candidates", "claim", "release"]

MAX_SUFFIX = 9999  # as Ultralytics' increment_path


def candidates(project: str | Path):
    """``project``, then ``project2``, ``project3``, ... up to ``project9999``."""
    base = Path(project)
    yield base
    for n in range(2, MAX_SUFFIX + 1):
        yield base.with_name(f"{base.name}{n}")


def claim(project: str | Path, *, exist_ok: bool = False) -> Path:
    """Make and return the run folder: ``project`` itself with ``exist_ok``, else its first free name."""
    base = Path(project)
    if not base.name:
        raise ConfigError(f"project {str(project)!r} names no folder; pass a path such as runs/train", field="project")
    base.parent.mkdir(parents=True, exist_ok=True)
    if exist_ok:
        if base.exists() and not base.is_dir():
            raise ConfigError(f"project {base} exists and is not a folder; pass another --project", field="project")
        base.mkdir(exist_ok=True)
        return base
    for candidate in candidates(base):
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return candidate
    raise ConfigError(
        f"{base} and {base}2 ... {base}{MAX_SUFFIX} are all taken; pass another --project or --exist-ok",
        field="project",
    )


def release(folder: str | Path) -> bool:
    """Remove a run folder that holds nothing of the run (at most a half-written ``last.pt.tmp``);
    True if it was removed. A folder with anything else in it is left as it is."""
    folder = Path(folder)
    (folder / "last.pt.tmp").unlink(missing_ok=True)
    try:
        folder.rmdir()
    except OSError:  # not empty (or gone): nothing of another's is removed
        return False
    return True
