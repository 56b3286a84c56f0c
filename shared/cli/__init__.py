"""The command-line machinery: the ``pixpool`` dispatcher, flags generated from the settings
dataclasses, and plain-text output. ``python -m pixpool.shared.cli`` runs the dispatcher."""

from .main import main

__all__ = ["main"]
