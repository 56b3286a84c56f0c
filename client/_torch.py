"""torch is the trainer extra: import it here, or say which extra to install.

Runs in the trainer process. A serving node installs ``pip install pixpool`` without
torch; only what trains (``pixpool train``, ``pixpool demo``'s trainers, tensors from the
``Client``) needs ``pip install 'pixpool[train]'``.
"""

from __future__ import annotations

from types import ModuleType

from ..shared.errors import MissingExtraError


def require_torch(what: str) -> ModuleType:
    """``import torch``, or MissingExtraError naming ``what`` and the extra to install."""
    try:
        import torch
    except ImportError as exc:
        raise MissingExtraError(
            f"{what} needs PyTorch, which is not installed here ({exc}); install the trainer extra: "
            "pip install 'pixpool[train]' (on a CPU-only machine install the CPU build of torch first)"
        ) from None
    return torch
