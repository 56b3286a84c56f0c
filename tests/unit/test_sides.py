"""The house's one rule on imports: shared/ imports neither side, client/ never server/, server/ never client/.

Walks the installed package's files with ``ast`` (every ``import`` and ``from`` statement,
at any depth, relative ones resolved), so a lazy import inside a function counts too. The
``pixpool`` dispatcher (``shared/cli.py``) names sub-command modules as strings and imports
the chosen one with ``importlib``: that is the one place that knows both sides, by design.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pixpool.client
import pixpool.server
import pixpool.shared

SIDES = {"server": pixpool.server, "client": pixpool.client, "shared": pixpool.shared}
FORBIDDEN = {"shared": {"server", "client"}, "client": {"server"}, "server": {"client"}}


def _modules(side: str):
    root = Path(SIDES[side].__path__[0])
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        yield path, ".".join(["pixpool", side, *parts]), path.name == "__init__.py"


def _imported(path: Path, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``path``."""
    package = module if is_package else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.append((node.lineno, name))
            out += [(node.lineno, f"{name}.{a.name}") for a in node.names]  # `from pixpool import server`
    return out


def _side_of(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "pixpool" and parts[1] in SIDES else None


def crossings(side: str) -> list[str]:
    bad = []
    for path, module, is_package in _modules(side):
        for line, name in _imported(path, module, is_package):
            other = _side_of(name)
            if other in FORBIDDEN[side]:
                bad.append(f"{path}:{line}: {module} imports {name}")
    return bad


@pytest.mark.parametrize("side", sorted(SIDES))
def test_no_import_crosses_sides(side):
    assert crossings(side) == []


def test_the_walk_sees_relative_and_lazy_imports(tmp_path):
    # The checker must see what it is meant to forbid: a relative import two levels up
    # inside a function body, and a plain absolute one.
    pkg = tmp_path / "daemon"
    pkg.mkdir()
    f = pkg / "x.py"
    f.write_text("def f():\n    from ...client.iterator import Client\n\nimport pixpool.client\n")
    names = [n for _, n in _imported(f, "pixpool.server.daemon.x", False)]
    assert "pixpool.client.iterator" in names and "pixpool.client" in names
    assert {_side_of(n) for n in names} == {"client"}


def test_every_module_is_walked():
    walked = {m for side in SIDES for _, m, _ in _modules(side)}
    for expected in ("pixpool.shared.protocol", "pixpool.server.daemon.service", "pixpool.server.snapshot.prepare",
                     "pixpool.client.iterator", "pixpool.client.commands.train", "pixpool.server.commands.serve"):
        assert expected in walked
