"""The house's one rule on imports: they run one way (``docs/architecture.md``, "Which part may import which").

shared/ imports no other part; client/ never server/; server/ never client/; ``ops/``
(accounting, memory report, status client, monitor views, plots) imports shared/ only, and
server/ does not import it (the daemon's status reply is declared in shared/, its metrics
endpoint is the daemon's own).
``integrations/`` (bridges to other frameworks) is trainer side: it may import client/ and
shared/, never server/. ``cli/`` (every command and the dispatcher) may import every part and
no part imports it. Ultralytics (AGPL-3.0) is imported only under
``pixpool.integrations.ultralytics``.

Walks the installed package's files with ``ast`` (every ``import`` and ``from`` statement,
at any depth, relative ones resolved), so a lazy import inside a function counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pixpool.cli
import pixpool.client
import pixpool.integrations
import pixpool.ops
import pixpool.server
import pixpool.shared

SIDES = {
    "cli": pixpool.cli,
    "server": pixpool.server,
    "client": pixpool.client,
    "shared": pixpool.shared,
    "integrations": pixpool.integrations,
    "ops": pixpool.ops,
}
FORBIDDEN = {
    "cli": set(),
    "ops": {"server", "client", "integrations", "cli"},
    "shared": {"server", "client", "integrations", "cli", "ops"},
    "client": {"server", "integrations", "cli", "ops"},
    "server": {"client", "integrations", "cli", "ops"},
    "integrations": {"server", "cli", "ops"},
}


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


def test_ultralytics_is_imported_only_by_its_integration():
    importers = sorted(
        module
        for side in SIDES
        for path, module, is_package in _modules(side)
        if any(
            name == "ultralytics" or name.startswith("ultralytics.") for _, name in _imported(path, module, is_package)
        )
    )
    assert importers, "the walk must see the integration's imports of ultralytics"
    home = "pixpool.integrations.ultralytics"
    assert all(m == home or m.startswith(home + ".") for m in importers), importers
    # The mapping and the batch layout stay importable without Ultralytics.
    assert not {
        "pixpool.integrations.ultralytics.hyp",
        "pixpool.integrations.ultralytics.batches",
        "pixpool.integrations.ultralytics.loader",
    } & set(importers)


def test_every_module_is_walked():
    walked = {m for side in SIDES for _, m, _ in _modules(side)}
    for expected in (
        "pixpool.shared.wire.trainer",
        "pixpool.server.daemon.service",
        "pixpool.server.snapshot.prepare",
        "pixpool.client.client",
        "pixpool.cli.train",
        "pixpool.cli.serve",
        "pixpool.ops.memory_report",
        "pixpool.integrations.ultralytics.trainer",
    ):
        assert expected in walked
