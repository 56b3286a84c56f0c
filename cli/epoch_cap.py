"""``PIXPOOL_MAX_EPOCHS``: an upper bound on the epochs of ``pixpool train`` and ``pixpool demo``.

Runs in the user's shell process, as those commands parse their flags. The documents' commands
train for 30 epochs; the test that runs every shell block of the README and ``docs/usage.md``
as written (``tests/integration/test_docs_blocks.py``) sets ``PIXPOOL_MAX_EPOCHS=1`` instead
of editing the blocks, and anyone may do the same to try a documented command quickly. The
run then is an N-epoch run (its LR schedule spans N epochs), and the command says so.
"""

from __future__ import annotations

import os
import sys

from ..shared.errors import ConfigError

ENV = "PIXPOOL_MAX_EPOCHS"


def max_epochs() -> int | None:
    """The bound set in the environment; None where it is unset or empty."""
    value = os.environ.get(ENV, "").strip()
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(f"{ENV}={value!r} must be a whole number of epochs >= 1 (or unset: no bound)")
    return int(value)


def capped(epochs: int, command: str) -> int:
    """``epochs``, or the environment's bound where that is lower (said on stderr)."""
    bound = max_epochs()
    if bound is None or epochs <= bound:
        return epochs
    print(
        f"{command}: {ENV}={bound}: training {bound} epoch{'s' if bound > 1 else ''} instead of {epochs}",
        file=sys.stderr,
    )
    return bound
