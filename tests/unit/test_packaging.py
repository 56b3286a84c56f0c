"""The installed package holds every folder of the checkout: ``pyproject.toml`` lists packages by
hand, and a folder missing there imports from an editable checkout but not from a wheel (a
user's ``pip install .``, CI's fresh venv)."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_listed_in_pyproject():
    setup = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed, roots = set(setup["packages"]), setup["package-dir"]
    found = set()
    for name, folder in roots.items():
        for init in (REPO / folder).rglob("__init__.py"):
            owner = max(
                (n for n, f in roots.items() if init.parent.is_relative_to(REPO / f)), key=lambda n: len(roots[n])
            )
            if owner == name:  # a folder inside another mapped folder (shared/_package) is that one's
                found.add(".".join([name, *init.parent.relative_to(REPO / folder).parts]))
    assert found - listed == set(), "folders with an __init__.py that pyproject.toml does not install"
    assert listed - found == set(), "pyproject.toml names packages that have no folder"
