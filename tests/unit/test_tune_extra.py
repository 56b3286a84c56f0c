"""The ``tune`` extra installs what ``pixpool yolo tune`` runs by default.

Ultralytics' searcher without ``search_alg=`` is Optuna, a package of its own: a search started
after ``pip install 'pixpool[ultralytics,tune]'`` must find it (``integrations/ultralytics/tuning.py``).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_tune_extra_installs_optuna_beside_ray_tune():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {re.split(r"[\[<>=!~ ;]", req, maxsplit=1)[0].lower() for req in extras["tune"]}
    assert {"ray", "optuna"} <= names, extras["tune"]
