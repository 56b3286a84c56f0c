"""The trainer side: the stream client of the daemon (``attach``, ``Client``, device HSV),
and, in ``train/``, the training loop (the reference detector, its step and ``fit``).

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
    "ClientOptions": "options",
    "TrainerBatch": "client",
    "DetectorStep": "train.step",
    "fit": "train.fit",
    "FitConfig": "train.fit",
    "apply_hsv": "hsv_torch",
}

__all__, __getattr__ = lazy_exports(__name__, (), _WHERE)
