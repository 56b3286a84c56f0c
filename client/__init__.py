"""The trainer side: the client of the daemon, device HSV, training step and loop, and the
trainer's and operator's commands.

It imports ``pixpool.shared``, never ``pixpool.server``: a trainer process loads neither
OpenCV nor the augmentation route.
torch is the ``train`` extra (``pip install 'pixpool[train]'``); the ``Client`` itself
works without it, yielding numpy views.

Names are imported on first use, so importing the package costs nothing (``TrainStep``
and ``train_on_daemon`` pull in torch).
"""

from importlib import import_module

__all__ = ["attach", "Loader", "Client", "TrainerBatch", "TrainStep", "train_on_daemon", "apply_hsv"]

_WHERE = {"attach": "loader", "Loader": "loader", "Client": "iterator", "TrainerBatch": "iterator", "TrainStep": "train", "train_on_daemon": "loop",
          "apply_hsv": "hsv_torch"}


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
