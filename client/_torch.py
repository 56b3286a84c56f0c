"""torch is the trainer extra: import it here, or say which extra to install.

Runs in the trainer process. A serving node installs ``pip install pixpool`` without
torch; only what trains (``pixpool train``, ``pixpool demo``'s trainers, tensors from the
``Client``) needs ``pip install 'pixpool[train]'``.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from ..shared.errors import MissingExtraError


def require_torch(what: str) -> ModuleType:
    """``import torch``, or MissingExtraError naming ``what`` and the extra to install."""
    try:
        import torch
    except ImportError as exc:
        raise _missing(what, str(exc)) from None
    return torch


def check_torch(what: str) -> None:
    """MissingExtraError unless torch is installed, without importing it: its import takes
    seconds, which ``attach()`` would otherwise pay before its first batch needs torch (the
    first batch imports it; a trainer's script usually has by then)."""
    if "torch" not in sys.modules and importlib.util.find_spec("torch") is None:
        raise _missing(what, "no module named 'torch'")


def _missing(what: str, why: str) -> MissingExtraError:
    return MissingExtraError(
        f"{what} needs PyTorch, which is not installed here ({why}); install the trainer extra: "
        "pip install 'pixpool[train]' (on a CPU-only machine install the CPU build of torch first)"
    )
