"""The trainer side: the client of the daemon (``attach``, ``Client``), the reference
detector (``detect``), its training step and loop (``step``, ``fit``), device HSV, and the
trainer's and operator's commands.

It imports ``pixpool.shared``, never ``pixpool.server``: a trainer process loads neither
OpenCV nor the augmentation route.
torch is the ``train`` extra (``pip install 'pixpool[train]'``); the ``Client`` itself
works without it, yielding numpy views.

Names are imported on first use (``shared/_lazy.py``), so importing the package loads only
``pixpool.shared`` (``DetectorStep`` and ``fit`` pull in torch).
"""

from ..shared._lazy import lazy_exports

_WHERE = {
    "attach": "loader",
    "Loader": "loader",
    "Batch": "batch",
    "Client": "client",
    "TrainerBatch": "client",
    "DetectorStep": "step",
    "fit": "fit",
    "FitConfig": "fit",
    "apply_hsv": "hsv_torch",
}

__all__, __getattr__ = lazy_exports(__name__, (), _WHERE)
