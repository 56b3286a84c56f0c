"""Every ``pixpool`` command: the dispatcher (``main.py``) and one module per sub-command.

Runs in the user's shell process. ``python -m pixpool.cli`` runs the dispatcher. This is the
one part that may import every other (``docs/architecture.md``); each command imports the
side it drives inside its ``run()``.
"""

from .main import main

__all__ = ["main"]
