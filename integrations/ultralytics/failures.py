"""What a refused ``pixpool yolo train`` tells the user, and what it leaves behind.

Runs in the trainer's process. Ultralytics reports the mistakes a user makes as exceptions
whose texts were written for its own CLI: a mistyped key is a ``SyntaxError`` after a help
screen, a missing dataset a ``RuntimeError`` wrapping the cause, a weights download on an
offline machine a ``ConnectionError`` with the URL. ``explain`` turns each into one
``ConfigError`` naming the key or file and what to do (the CLI prints it as one line, no
traceback); anything else is left as it was. ``remove_unused_run`` deletes the run folder
Ultralytics made for a run that was refused before it trained (only ``args.yaml`` and an
empty ``weights/`` in it), so a refused run leaves no folder behind and the next run gets
its name back. ``cv2_problem`` checks the two OpenCV distributions that both own ``cv2``.

Nothing here imports Ultralytics: the unit tests run without it.
"""

from __future__ import annotations

import difflib
import re
import shutil
import unicodedata
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ...shared.errors import ConfigError

__all__ = ["CV2_DISTRIBUTIONS", "check_cv2", "cv2_problem", "explain", "remove_unused_run"]

# Ultralytics' SyntaxError for a key it does not know, one line per key.
_UNKNOWN_KEY = re.compile(
    r"'(?P<key>[^']+)' is not a valid YOLO argument\.(?: Similar arguments are i\.e\. \[(?P<similar>[^\]]*)\]\.)?"
)
# BaseTrainer.get_dataset's wrapper around whatever reading ``data=`` raised.
_DATASET = re.compile(r"^Dataset '(?P<data>[^']*)' error\s*(?P<cause>.*)$", re.S)
_DOWNLOAD = re.compile(r"Download failure for (?P<url>\S+?)\.?\s(?P<reason>.*)$", re.S)
_QUOTED = re.compile(r"'(?P<path>[^']+)'")


def explain(exc: BaseException, *, overrides: Mapping[str, Any], valid_keys: Iterable[str] = ()) -> ConfigError | None:
    """One ConfigError line for an Ultralytics failure the user caused, or None to let ``exc`` be.

    ``overrides``: the run's ``key=value`` settings (to name ``model=`` and ``data=``);
    ``valid_keys``: Ultralytics' settings, for the suggestions of a mistyped key."""
    text = _plain(str(exc))
    model, data = overrides.get("model"), overrides.get("data")
    if isinstance(exc, SyntaxError) and _UNKNOWN_KEY.search(text):
        return _unknown_keys(text, overrides, list(valid_keys))
    match = _DATASET.match(text)
    if isinstance(exc, RuntimeError) and match:
        cause = match["cause"].strip() or "it could not be read"
        return ConfigError(
            f"data={data if data is not None else match['data']}: {cause.rstrip('.')}; give the path of a data.yaml "
            "(or a dataset name Ultralytics knows, on a machine that can download it)",
            field="data",
            value=data,
        )
    match = _DOWNLOAD.search(text)
    if isinstance(exc, ConnectionError) and match:
        url = match["url"]
        name = url.rsplit("/", 1)[-1]
        reason = match["reason"].strip().rstrip(".") or "no reason given"
        if model is not None and Path(str(model)).name == name:
            return ConfigError(
                f"model={model}: the weights could not be downloaded from {url} ({reason}); on a machine without network "
                f"copy {name} here and give its path (model=PATH/{name}), or train from scratch (model={Path(name).stem}.yaml)",
                field="model",
                value=model,
            )
        return ConfigError(f"could not download {url} ({reason}); copy the file here and give its path instead")
    if isinstance(exc, FileNotFoundError):
        quoted = _QUOTED.search(text)
        path = quoted["path"] if quoted else (exc.filename or text)
        key = next((k for k, v in (("model", model), ("data", data)) if v is not None and str(v) == str(path)), None)
        where = f"{key}={path}" if key else str(path)
        return ConfigError(
            f"{where}: the file does not exist; check the path", field=key, value=overrides.get(key) if key else None
        )
    return None


def _unknown_keys(text: str, overrides: Mapping[str, Any], valid: list[str]) -> ConfigError:
    parts, first = [], None
    for m in _UNKNOWN_KEY.finditer(text):
        key = m["key"]
        first = first or key
        similar = [s.strip().strip("'\"").split("=", 1)[0] for s in (m["similar"] or "").split(",") if s.strip()]
        similar = similar or difflib.get_close_matches(key, valid)
        value = overrides.get(key)
        given = f"{key}={value}" if value is not None else f"{key}="
        hint = f"did you mean {' or '.join(s + '=' for s in similar)}?" if similar else "no setting is spelled like it"
        parts.append(f"{given} is not an Ultralytics setting ({hint})")
    return ConfigError(
        "; ".join(parts) + "; fix the key (`yolo cfg` lists every setting)", field=first, value=overrides.get(first)
    )


def _plain(text: str) -> str:
    """``text`` without emoji and pictographs (Ultralytics' ❌, ⚠️), its whitespace collapsed."""
    kept = "".join(ch for ch in text if unicodedata.category(ch) not in ("So", "Mn", "Cf") or ch.isascii())
    return " ".join(kept.split())


def remove_unused_run(save_dir: str | Path | None) -> bool:
    """Remove ``save_dir`` if the run never trained: it holds ``args.yaml``, an empty
    ``weights/`` and the log of the daemon the run started (``trainer.DAEMON_LOG``) at most.
    True when removed. Anything else in it (a results.csv, a checkpoint, a user's file) keeps
    the folder."""
    if save_dir is None:
        return False
    path = Path(save_dir)
    if not path.is_dir() or path.is_symlink():
        return False
    for entry in path.iterdir():
        if entry.name in ("args.yaml", "pixpool-daemon.log") and entry.is_file():
            continue
        if entry.name == "weights" and entry.is_dir() and not entry.is_symlink() and not any(entry.iterdir()):
            continue
        return False
    shutil.rmtree(path)
    return True


# The distributions that install the ``cv2`` package: pixpool needs the headless one, Ultralytics
# asks for the other; pip puts both files in one folder, and the last one installed wins.
CV2_DISTRIBUTIONS = (
    "opencv-python-headless",
    "opencv-python",
    "opencv-contrib-python",
    "opencv-contrib-python-headless",
)


def cv2_problem(installed: Mapping[str, str], *, imports: bool) -> str | None:
    """What is wrong with ``cv2`` here, or None. ``installed``: distribution -> version, of the
    ``CV2_DISTRIBUTIONS`` installed; ``imports``: whether ``import cv2`` works.

    Several of them at one version share ``cv2`` harmlessly (``pip install pixpool[ultralytics]``
    gives opencv-python-headless and opencv-python). At different versions the folder holds a
    mix of both; and once one of them is uninstalled, the other's ``cv2`` is gone too."""
    names = sorted(installed)
    if not imports:
        pick = names[0] if names else "opencv-python-headless"
        return (
            f"cv2 cannot be imported although {', '.join(names) or 'no OpenCV distribution'} "
            "is installed (uninstalling one OpenCV distribution removes the cv2 files the others share); "
            f"reinstall it: pip install --force-reinstall --no-deps {pick}=={installed.get(pick, '<version>')}"
            if names
            else "cv2 cannot be imported: no OpenCV distribution is installed; pip install opencv-python-headless"
        )
    versions = {installed[n] for n in names}
    if len(versions) > 1:
        listed = ", ".join(f"{n} {installed[n]}" for n in names)
        newest = max(versions, key=_version_key)
        return (
            f"{listed} are installed and all write the same cv2 files, so cv2 is a mix of versions; "
            f"install one version for all: pip install --force-reinstall --no-deps "
            + " ".join(f"{n}=={newest}" for n in names)
        )
    return None


def _version_key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else 0 for p in re.split(r"[.+-]", version))


def check_cv2() -> None:
    """MissingExtraError when ``cv2`` is broken by its several distributions (``cv2_problem``)."""
    from importlib import metadata

    from ...shared.errors import MissingExtraError

    installed = {}
    for name in CV2_DISTRIBUTIONS:
        try:
            installed[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    try:
        import cv2  # noqa: F401
    except ImportError:
        imports = False
    else:
        imports = True
    problem = cv2_problem(installed, imports=imports)
    if problem is not None:
        raise MissingExtraError(problem)
