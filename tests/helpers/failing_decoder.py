"""A stand-in decoder for preparation (``prepare_snapshot(..., decoder=)``): the decoder that
claims record ``FAIL_AT`` fails as a corrupt image would; every other record decodes as usual.

Imported by name (``helpers.failing_decoder``) in the preparing process and in each of its
spawned decode workers, so whichever of them claims the record fails.
"""

from __future__ import annotations

from pixpool.server.snapshot import decode_worker
from pixpool.shared.errors import ImageDecodeError

FAIL_AT = 7


def decode_record(index: int, path: str):
    if index == FAIL_AT:
        raise ImageDecodeError(f"injected failure at record {index} (fail_at)", path=path)
    return decode_worker.decode_record(index, path)
