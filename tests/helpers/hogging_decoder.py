"""A stand-in decoder for preparation (``prepare_snapshot(..., decoder=)``): the decoder that
claims record ``HOG_AT`` first fills what is left of /dev/shm with a file of its own (another
program taking the room mid-preparation), then decodes as usual, so that a later write of the
arena finds the store full.

Imported by name (``helpers.hogging_decoder``) in the preparing process and in each of its
spawned decode workers.
"""

from __future__ import annotations

import os

from pixpool.server.snapshot import decode_worker

HOG_AT = 3
HOG_PATH = "/dev/shm/hog"


def decode_record(index: int, path: str):
    if index == HOG_AT:
        st = os.statvfs("/dev/shm")
        fd = os.open(HOG_PATH, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.posix_fallocate(fd, 0, st.f_bavail * st.f_frsize)
        finally:
            os.close(fd)
    return decode_worker.decode_record(index, path)
