"""Every shared-memory name pixpool creates is built here, from one prefix, and parsed here.

Code both sides import. A cleanup command can sweep ``/dev/shm/pixpool*`` after a crash
without guessing, and no other module takes a name apart by hand: ``parse`` says what a
segment is.

Every name carries the uid of the user whose processes made it (``pixpool-u<uid>-...``):
/dev/shm is shared by every user of the machine, so two users never collide on a name,
and ``ls``/``clean`` look at the caller's own names only. The uid in a name is a claim,
not a proof (anyone may create any name in /dev/shm): ``shared.transport.shm`` checks the file's
real owner and mode before mapping anything.

- A snapshot is three segments ``pixpool-u<uid>-snap-<fp16>-<part>`` (part meta, img,
  tgt) that share the base name ``pixpool-u<uid>-snap-<fp16>``, derived from the input
  fingerprint (computable by anyone who can read the dataset: hence the owner check), and
  any label indexes beside them (part ``lix<8 hex>``, a plain file each).
- A batch ring is ``pixpool-u<uid>-ring-<daemon pid>-<random hex>``: the pid is for people
  to read (it is the daemon's pid in its own PID namespace, PID 1 in every container) and
  decides nothing: whether the ring's daemon is alive, or anyone uses the ring, is told by
  the locks on its file (``shared.transport.holds``). The random part makes the name unguessable,
  so nobody can squat the next ring name before the daemon creates it.
- A temporary file is ``<segment name>.tmp-<random hex>`` (``temporary_name``;
  ``shared.transport.publish``): it exists only for the moment between linking a finished
  file and renaming it into place, or, where the store has no anonymous files, while it is
  written; its writer holds it meanwhile. Older releases named it ``<name>.tmp<pid>``. Either,
  when nobody holds it, is a killed writer's debris (``parse``: kind "debris"), which
  ``publish.sweep_debris`` and ``pixpool clean`` remove.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass

PREFIX = "pixpool"
# The default store, the one constant for it (``DaemonConfig.store``, every ``--store`` flag and
# ``Store.of(None)`` fall back to it): a tmpfs on every Linux machine.
# ``shared.transport.store`` says what a store is, and builds every path in one.
DEFAULT_STORE = "/dev/shm"

# Snapshot segments: one header+index segment, one image arena, one target segment.
SNAPSHOT_PARTS = ("meta", "img", "tgt")
# Beside them, none or more label indexes (``server/snapshot/label_index.py``): files named
# ``<base>-lix<first 8 hex of a lineage>``, one per dataset spelling the snapshot serves. They
# belong to the snapshot's unit (``clean`` and ``Snapshot.release`` remove them with it) when
# their owner and content say so, never by the name alone: ``server/snapshot/unit.py``.
LABEL_INDEX_PART = "lix"
_LINEAGE_HEX_DIGITS = 8
# Random hex digits in a ring name: 64 bits, far beyond guessing.
RING_TOKEN_HEX_DIGITS = 16
# What follows a segment name in a temporary file's name (``temporary_name``).
TEMPORARY_MARK = ".tmp"


def user_prefix(uid: int | None = None) -> str:
    """What every segment of user ``uid`` (default: this process's effective uid) starts with."""
    return f"{PREFIX}-u{os.geteuid() if uid is None else int(uid)}-"


def snapshot_base(key: str, *, uid: int | None = None) -> str:
    """Base name ``pixpool-u<uid>-snap-<key>`` of the snapshot whose fingerprint starts with ``key``."""
    if not key or not _is_hex(key):
        raise ValueError(f"invalid snapshot key {key!r}: hex digits only")
    return f"{user_prefix(uid)}snap-{key}"


def snapshot_parts(base: str) -> dict[str, str]:
    """part -> segment name, for a base name ``pixpool-u<uid>-snap-<key>``."""
    parsed = parse(base + "-meta")
    if parsed is None or parsed.kind != "snapshot":
        raise ValueError(f"not a snapshot base name: {base!r} (expected {PREFIX}-u<uid>-snap-<fingerprint>)")
    return {part: f"{base}-{part}" for part in SNAPSHOT_PARTS}


def label_index_part(lineage: str) -> str:
    """The part name of the label index of ``lineage`` (``fingerprint.lineage_of``, hex)."""
    key = lineage[:_LINEAGE_HEX_DIGITS]
    if len(key) != _LINEAGE_HEX_DIGITS or not _is_hex(key):
        raise ValueError(f"invalid lineage {lineage!r}: {_LINEAGE_HEX_DIGITS}+ hex digits expected")
    return LABEL_INDEX_PART + key


def label_index_name(base: str, lineage: str) -> str:
    """``<snapshot base>-lix<8 hex>``: the label index of ``lineage`` beside snapshot ``base``."""
    snapshot_parts(base)  # refuses what is no snapshot base name
    return f"{base}-{label_index_part(lineage)}"


def _is_label_index_part(part: str) -> bool:
    key = part[len(LABEL_INDEX_PART) :]
    return part.startswith(LABEL_INDEX_PART) and len(key) == _LINEAGE_HEX_DIGITS and _is_hex(key)


def ring_segment(daemon_pid: int, token: str, *, uid: int | None = None) -> str:
    """Name of one batch ring of the daemon with ``daemon_pid``; ``token`` is random hex
    (``new_ring_token``) so the name cannot be predicted."""
    if not token or not _is_hex(token):
        raise ValueError(f"invalid ring token {token!r}: hex digits only")
    return f"{ring_prefix(daemon_pid, uid=uid)}{token}"


def ring_prefix(daemon_pid: int, *, uid: int | None = None) -> str:
    """What every ring of the daemon with ``daemon_pid`` starts with."""
    return f"{user_prefix(uid)}ring-{int(daemon_pid)}-"


def new_ring_token() -> str:
    return secrets.token_hex(RING_TOKEN_HEX_DIGITS // 2)


def temporary_name(name: str) -> str:
    """A fresh random temporary name for a file to be published as ``name``: 64 random bits,
    so that nobody can create it first."""
    return f"{name}{TEMPORARY_MARK}-{secrets.token_hex(RING_TOKEN_HEX_DIGITS // 2)}"


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


@dataclass(frozen=True)
class SegmentName:
    """What a pixpool segment name says. ``group`` is what ``clean`` removes as one unit:
    a snapshot's base name, or the ring's own name."""

    name: str
    kind: str  # "snapshot", "ring" or "debris" (a temporary file: ``temporary_name``)
    group: str
    uid: int  # the user the name claims (shm.py checks the file's real owner)
    part: str | None = None  # snapshot part
    daemon_pid: int | None = None  # ring owner
    token: str | None = None  # a ring's random part


def parse(name: str) -> SegmentName | None:
    """What ``name`` is, or None where it is no well-formed pixpool snapshot, ring or
    temporary name (names of older releases, ``pixpool-snap-...`` without a uid, are None too)."""
    stem, mark, _ = name.rpartition(TEMPORARY_MARK)
    if mark and stem:
        parsed = _parse_segment(stem)
        if parsed is None:
            return None
        return SegmentName(name, "debris", name, parsed.uid)
    return _parse_segment(name)


def _parse_segment(name: str) -> SegmentName | None:
    head = f"{PREFIX}-u"
    if not name.startswith(head):
        return None
    uid, _, rest = name[len(head) :].partition("-")
    if not uid.isdigit():
        return None
    kind, _, rest = rest.partition("-")
    if kind == "snap":
        key, _, part = rest.partition("-")
        if (part in SNAPSHOT_PARTS or _is_label_index_part(part)) and key and _is_hex(key):
            return SegmentName(name, "snapshot", name[: -len(part) - 1], int(uid), part=part)
    elif kind == "ring":
        pid, _, token = rest.partition("-")
        if pid.isdigit() and token and _is_hex(token):
            return SegmentName(name, "ring", name, int(uid), daemon_pid=int(pid), token=token)
    return None


def kind_of(name: str) -> str | None:
    """ "snapshot", "ring", "debris", or None for a name that is none of them."""
    parsed = parse(name)
    return parsed.kind if parsed is not None else None


def group_of(name: str) -> str:
    """The unit ``name`` belongs to: a snapshot's base name, else the name itself."""
    parsed = parse(name)
    return parsed.group if parsed is not None else name


def expected_owner(name: str) -> int:
    """The uid a segment called ``name`` must belong to: the one its name carries, else
    (a name without one, e.g. a test's) this process's effective uid."""
    parsed = parse(name)
    return parsed.uid if parsed is not None else os.geteuid()
