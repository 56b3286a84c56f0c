"""The snapshot's dtype has one default, uint8 (``config.DEFAULT_SNAPSHOT_DTYPE``), and every
command and function that prepares or serves a snapshot takes it from there (``--dtype``'s help:
tests/unit/test_config_cli.py)."""

from __future__ import annotations

import ast
from pathlib import Path

from pixpool.shared.stream.config import DEFAULT_SNAPSHOT_DTYPE, SNAPSHOT_DTYPES, DaemonConfig, PrepareOptions

ROOT = Path(__file__).resolve().parents[2]
# The package's code; bench/ and tests/ name a dtype on purpose where they measure or check one.
PACKAGE = ("cli", "client", "integrations", "ops", "server", "shared")


def test_the_default_is_uint8_in_every_configuration():
    assert DEFAULT_SNAPSHOT_DTYPE == "uint8" and DEFAULT_SNAPSHOT_DTYPE in SNAPSHOT_DTYPES
    config = DaemonConfig(data="x")
    assert config.dtype == config.prepare_options().dtype == PrepareOptions().dtype == DEFAULT_SNAPSHOT_DTYPE


def _literal_dtype_defaults(path: Path) -> list[str]:
    """'file:line name' of each parameter called dtype whose default is a string literal."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        a = node.args
        pairs = list(zip(a.args[len(a.args) - len(a.defaults) :], a.defaults)) + list(zip(a.kwonlyargs, a.kw_defaults))
        for arg, default in pairs:
            if arg.arg == "dtype" and isinstance(default, ast.Constant) and isinstance(default.value, str):
                found.append(f"{path.relative_to(ROOT)}:{default.lineno} {node.name}(dtype={default.value!r})")
    return found


def test_no_function_of_the_package_spells_its_own_default_dtype():
    files = [p for top in PACKAGE for p in (ROOT / top).rglob("*.py")]
    assert files
    found = [hit for p in files for hit in _literal_dtype_defaults(p)]
    assert found == [], "take the default from shared.stream.config.DEFAULT_SNAPSHOT_DTYPE: " + "; ".join(found)
