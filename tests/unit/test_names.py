"""Names a reader relies on: each API package's ``__all__``, and errno values spelled by name.

Unit tests: imports and ``ast`` walks of the installed package's files; no process is started.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

API_PACKAGES = (
    "pixpool.client",
    "pixpool.server",
    "pixpool.shared",
    "pixpool.shared.stream",
    "pixpool.shared.transport",
    "pixpool.cli",
)


@pytest.mark.parametrize("package", API_PACKAGES)
def test_every_name_in_all_resolves(package):
    module = importlib.import_module(package)
    names = module.__all__
    assert names and len(names) == len(set(names)), f"{package}.__all__ is empty or repeats a name"
    missing = [n for n in names if not hasattr(module, n)]
    assert missing == [], f"{package}.__all__ lists names it does not have: {missing}"
    star: dict = {}
    exec(f"from {package} import *", star)
    assert set(names) <= set(star)


def test_the_contract_and_the_transport_are_reachable_from_their_packages():
    from pixpool.shared import stream, transport
    from pixpool.shared.stream.config import StreamSettings
    from pixpool.shared.transport import names, store

    assert stream.StreamSettings is StreamSettings and stream.config.StreamSettings is StreamSettings
    # One default store: every module that falls back to it reads the same constant.
    assert transport.DEFAULT_STORE == names.DEFAULT_STORE == store.DEFAULT_STORE == "/dev/shm"
    from pixpool.shared.stream.config import DaemonConfig

    assert DaemonConfig(data="x").store == names.DEFAULT_STORE
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        stream.nothing  # noqa: B018


def _errno_literals(path: Path) -> list[str]:
    """Where ``path`` compares an ``.errno`` with a number, or builds an OSError from one."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Attribute) and s.attr == "errno" for s in sides):
                numbers = [
                    c
                    for s in sides
                    for c in ([*s.elts] if isinstance(s, (ast.Tuple, ast.List, ast.Set)) else [s])
                    if isinstance(c, ast.Constant) and type(c.value) is int
                ]
                if numbers:
                    found.append(f"{path}:{node.lineno}: errno compared with {[c.value for c in numbers]}")
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in {"OSError", "FileNotFoundError"}:
            if node.args and isinstance(node.args[0], ast.Constant) and type(node.args[0].value) is int:
                found.append(f"{path}:{node.lineno}: {node.func.id}({node.args[0].value}, ...)")
    return found


@pytest.mark.parametrize("side", ["pixpool.client", "pixpool.integrations", "pixpool.shared"])
def test_errno_values_are_spelled_by_name(side):
    root = Path(importlib.import_module(side).__path__[0])
    found = [hit for path in sorted(root.rglob("*.py")) for hit in _errno_literals(path)]
    assert found == [], f"use the errno module's names (errno.ENOSPC, ...): {found}"


def test_the_errno_walk_sees_numbers(tmp_path):
    f = tmp_path / "x.py"
    f.write_text(
        "try:\n    pass\nexcept OSError as exc:\n    if exc.errno in (28, errno.ENOMEM):\n        raise OSError(2, 'x')\n"
        "    ok = exc.errno == errno.ENOSPC\n"
    )
    hits = _errno_literals(f)
    assert len(hits) == 2 and "[28]" in hits[0] and "OSError(2" in hits[1]


# -- references in prose ---------------------------------------------------------------------
REPO = Path(__file__).resolve().parents[2]
TOP = ("server", "client", "shared", "integrations", "tests", "docs", "deploy", "bench", "examples")
_PATH = re.compile(rf"(?<![\w./-])((?:{'|'.join(TOP)})/[\w./-]*\w\.(?:py|md|c|h|yaml|yml|json|toml|png|service))\b")
_INVARIANT = re.compile(r"\binvariants? (\d+)", re.IGNORECASE)


def _texts():
    """(path, text) of the repository's sources and documents."""
    for top in (*TOP, "README.md", "Dockerfile", "compose.yaml", "pyproject.toml"):
        root = REPO / top
        for path in [root] if root.is_file() else sorted(root.rglob("*")):
            if path.is_file() and path.suffix in {"", ".py", ".md", ".c", ".h", ".yaml", ".yml", ".toml", ".service"}:
                yield path, path.read_text(errors="replace")


def test_every_file_named_in_code_and_docs_exists():
    stale = [
        f"{path.relative_to(REPO)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(1)}"
        for path, text in _texts()
        for m in _PATH.finditer(text)
        if not (REPO / m.group(1)).exists()
    ]
    assert stale == [], f"these name files that are not in the repository: {stale}"


def test_the_invariants_cited_are_written_down_with_tests_that_exist():
    doc = (REPO / "docs" / "invariants.md").read_text()
    numbers = {int(n) for n in re.findall(r"^## (\d+)\. ", doc, re.MULTILINE)}
    assert numbers == set(range(1, len(numbers) + 1)) and len(numbers) >= 10
    cited = {
        (int(m.group(1)), str(path.relative_to(REPO)))
        for path, text in _texts()
        if path.name != "invariants.md"
        for m in _INVARIANT.finditer(text)
    }
    assert cited, "the code cites invariants (handle.py, test_augment_range.py); the walk must see them"
    assert {(n, where) for n, where in cited if n not in numbers} == set()
    # Every section names tests, and every test named is defined in the file named.
    for section in re.split(r"^## ", doc, flags=re.MULTILINE)[1:]:
        refs = re.findall(r"`(tests/[\w/]+\.py)::(test_\w+)`", section)
        assert refs, f"invariant {section.split('.')[0]} names no test"
        for file, name in refs:
            assert re.search(rf"^def {name}\(", (REPO / file).read_text(), re.MULTILINE), (
                f"{file}::{name} is not a test"
            )
