"""What belongs to a snapshot: its removal unit, decided by each file's owner and content.

Runs wherever a snapshot is removed or listed: ``Snapshot.release`` and ``unlink``
(``handle.py``), ``remove_superseded`` and the re-attach (``reuse.py``), ``pixpool ls`` and
``pixpool clean``. A snapshot is its three segments and the label indexes written beside it
(``label_index.py``), and the store is shared: anyone can create a file under any name in it,
``<snapshot base>-lix00000000`` included. A name says nothing about whose a file is, so a
file is a label index of snapshot ``base`` only when

- it is a regular file of the user the name carries (``trusted.open_trusted``: opened
  non-blocking and no-follow, checked on the open descriptor; its mode may be any, an own
  file made writable by others is still ours to remove), and
- its content says so: the index's magic, and the snapshot fingerprint in its meta naming
  ``base`` (read from the file's first few kilobytes; the checksum over the whole body is
  the reader's business, ``label_index.read_index``).

Anything else under such a name (another user's file, a FIFO, a directory, a file of ours
holding something else) is no part of the unit: it neither keeps the snapshot (a lock on it
means nothing to us) nor makes its removal fail (a file we may not open), is never removed
with it, and ``pixpool ls`` reports it (``strays``).
"""

from __future__ import annotations

import json
import os
import struct

from ...shared.errors import UntrustedSegmentError
from ...shared.transport.names import parse, snapshot_parts
from ...shared.transport.store import DEFAULT, Store
from ...shared.transport.trusted import open_trusted

__all__ = ["label_indexes", "strays", "unit_names"]

# The meta of an index is a few hundred bytes of JSON (class names, counts); one this long is
# no index of ours (its checksum would fail anyway).
_META_MAX_NBYTES = 1 << 20


def _candidates(base: str, store: Store) -> list[str]:
    """Names in ``store`` that say they are a label index of snapshot ``base``."""
    head = f"{base}-"
    out = []
    for seg in store.segments():
        if seg.startswith(head):
            parsed = parse(seg)
            if (
                parsed is not None
                and parsed.kind == "snapshot"
                and parsed.group == base
                and parsed.part.startswith("lix")
            ):
                out.append(seg)
    return out


def why_not_member(name: str, base: str, store: Store) -> str | None:
    """None where file ``name`` is a label index of snapshot ``base`` (module docstring), else
    why not, in words that name the file; "gone" where it no longer exists."""
    from .label_index import _HEAD, MAGIC

    try:
        fd = open_trusted(name, store=store, any_mode=True)
    except FileNotFoundError:
        return "gone"
    except UntrustedSegmentError as exc:
        return str(exc)
    try:
        head = os.pread(fd, _HEAD.size + 8, 0)
        if len(head) < _HEAD.size + 8 or head[: len(MAGIC)] != MAGIC:
            return f"{name} holds no label index (no {MAGIC!r} header)"
        (text_nbytes,) = struct.unpack_from("<Q", head, _HEAD.size)
        if text_nbytes > _META_MAX_NBYTES:
            return f"{name} holds no label index (a meta of {text_nbytes} bytes)"
        meta = json.loads(os.pread(fd, text_nbytes, _HEAD.size + 8))
        fingerprint = str(meta["fingerprint"])
    except (ValueError, KeyError, TypeError, OSError) as exc:
        return f"{name} holds no readable label index ({exc})"
    finally:
        os.close(fd)
    key = base.rsplit("-", 1)[-1]
    if not fingerprint.startswith(key):
        return f"{name} is the label index of another snapshot (fingerprint {fingerprint[:16]}), not of {base}"
    return None


def label_indexes(base: str, store: Store = DEFAULT) -> list[str]:
    """The label index files of snapshot ``base`` in ``store`` (``label_index.py``), by owner and
    content (module docstring), never by name alone."""
    return [seg for seg in _candidates(base, store) if why_not_member(seg, base, store) is None]


def unit_names(base: str, store: Store = DEFAULT) -> list[str]:
    """Every file of snapshot ``base`` that goes as one unit: its three segments and its label indexes."""
    return [*snapshot_parts(base).values(), *label_indexes(base, store)]


def strays(base: str, store: Store = DEFAULT) -> dict[str, str]:
    """Files under names of snapshot ``base``'s label indexes that are no part of it: name -> why."""
    out = {}
    for seg in _candidates(base, store):
        why = why_not_member(seg, base, store)
        if why is not None and why != "gone":
            out[seg] = why
    return out
