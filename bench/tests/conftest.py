"""The bench scripts' own tests: ``cd bench/tests && python -m pytest`` (not part of the product suite).

Puts ``bench/`` first on ``sys.path``, as running a bench script does, so that its helper
modules (``_common``, ``_fidelity_stats``, ...) import by name. Unit tests only: they start
no process.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
