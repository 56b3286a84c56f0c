"""A route for the daemon tests: the real one, except that the first worker to render a part
of batch 1 that holds sample position 0 hangs (once per marker file named by
PIXPOOL_TEST_STUCK_MARKER), as a wedged worker would. The marker holds that worker's pid, so a
test may also SIGKILL it mid-part."""

from __future__ import annotations

import os
import time

from pixpool.server.daemon.renderer import batch_size_of, max_targets, num_batches  # noqa: F401  (the route's interface)
from pixpool.server.daemon.renderer import render_range as _render_range


def render_range(source, settings, epoch, batch, start, stop, images_out, masks_out=None):
    marker = os.environ.get("PIXPOOL_TEST_STUCK_MARKER")
    if batch == 1 and start == 0 and marker:
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            pass
        else:
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            time.sleep(600)  # wedged: only the daemon's job timeout gets this batch done
    return _render_range(source, settings, epoch, batch, start, stop, images_out, masks_out)
