"""``python -m pixpool.cli``: the ``pixpool`` command."""

import sys

from .main import main

sys.exit(main())
