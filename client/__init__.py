"""The trainer side: the client of the daemon (``attach``, ``Client``), the reference
detector (``detect``), its training step and loop (``step``, ``fit``), device HSV, and the
trainer's and operator's commands.

It imports ``pixpool.shared``, never ``pixpool.server``: a trainer process loads neither
OpenCV nor the augmentation route.
torch is the ``train`` extra (``pip install 'pixpool[train]'``); the ``Client`` itself
works without it, yielding numpy views.

Names are imported on first use, so importing the package costs nothing (``DetectorStep``
and ``fit`` pull in torch).
"""

from importlib import import_module

__all__ = ["attach", "Loader", "Batch", "Client", "TrainerBatch", "DetectorStep", "fit", "FitConfig", "apply_hsv"]

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


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
