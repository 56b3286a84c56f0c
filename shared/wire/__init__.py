"""The wire: every message between processes, msgpack maps checked against declared tables.

- ``trainer``: trainer <-> daemon (``Op``, ``REQUESTS``, ``REPLIES``, the size limits, ``encode``/``decode``).
- ``worker_pipe``: daemon <-> augmentation worker (``PipeOp``, ``PIPE``).
- ``error_codes``: an ``error`` reply's code <-> the exception class it stands for.
- ``status``: the ``status`` and ``health`` replies as declared values (``Status``, ``Health``).

Each message's fields are ``pixpool.shared.schema`` declarations, the same validator the
settings use. Importers take what they use from the module that declares it.
"""

from .._lazy import lazy_exports

_MODULES = ("trainer", "worker_pipe", "error_codes", "status")

__all__, __getattr__ = lazy_exports(__name__, _MODULES, {})
