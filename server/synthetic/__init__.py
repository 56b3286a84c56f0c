"""The embedded synthetic datasets that ``pixpool synth`` writes: the default detect and
segment set of coloured shapes (``shapes``), pose figures and rotated boxes (``tasks``), and
their shared drawing (``draw``).

Runs in the process that asks for it (``pixpool synth``, the demo, the test fixtures).
"""

from .shapes import CATEGORY_IDS, CLASS_NAMES, SYNTH_TASKS, SyntheticData, write_synthetic

__all__ = ["CATEGORY_IDS", "CLASS_NAMES", "SYNTH_TASKS", "SyntheticData", "write_synthetic"]
