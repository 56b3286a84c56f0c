"""Lazy re-exports for pixpool's packages (``pixpool.server``, ``pixpool.client``,
``pixpool.client.train.detect`` and the sub-packages of ``pixpool.shared``).

Code both sides import. A package names its modules and the names it re-exports from
them; each is imported on first use (PEP 562 ``__getattr__``), so ``import
pixpool.shared.transport`` costs nothing until a name is asked for, a serving node never
imports a module it does not use, and ``import pixpool.client.train.detect`` does not load torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any, Callable


def lazy_exports(
    package: str, modules: tuple[str, ...], where: dict[str, str]
) -> tuple[list[str], Callable[[str], Any]]:
    """``(__all__, __getattr__)`` for ``package``: its ``modules`` and the names ``where`` maps to their module."""

    def __getattr__(name: str) -> Any:
        if name in modules:
            return import_module(f"{package}.{name}")
        if name in where:
            return getattr(import_module(f"{package}.{where[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return [*modules, *where], __getattr__
