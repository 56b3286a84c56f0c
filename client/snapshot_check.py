"""Which snapshot a trainer's stream is on, and what changed when a restarted daemon serves another.

Runs in the trainer process, inside ``Client``: each ``attached`` reply names the snapshot
the trainer's split streams (``shared/wire/trainer.py``: fingerprint of its content, name,
record count) and the daemon's class names. The first attach fixes the stream's snapshot;
an attach after a restart is compared with it (``changed``), and a different one stops
the trainer with ``SnapshotChangedError`` (``refusal``) unless the user asked to follow the
daemon. The fingerprint is the content's (``server/snapshot/fingerprint.py``), so a daemon
restarted on the same files re-attaches as before, and one restarted on a uint8 snapshot
of the same data (the very same batches) counts as the same snapshot.
"""

from __future__ import annotations

import logging

from ..shared.errors import SnapshotChangedError

log = logging.getLogger(__name__)

_FP_SHOWN = 16  # hex digits of a fingerprint shown in messages (the snapshot name's share)


def identity(attached: dict) -> dict:
    """The snapshot an ``attached`` reply names: fingerprint ("" from a daemon or source that
    does not say), name, records, names (the class names)."""
    snap = attached.get("snapshot")
    snap = snap if isinstance(snap, dict) else {}
    return {
        "fingerprint": str(snap.get("fingerprint") or ""),
        "name": str(snap.get("name") or ""),
        "records": int(attached["num_records"]),
        "names": [str(n) for n in attached.get("names") or []],
    }


def changed(before: dict, after: dict) -> bool:
    """Another snapshot: another content fingerprint where both sides have one; else another
    record count or other class names (all that can be compared then)."""
    if before["fingerprint"] and after["fingerprint"]:
        return before["fingerprint"] != after["fingerprint"]
    return before["records"] != after["records"] or before["names"] != after["names"]


def differences(before: dict, after: dict) -> list[str]:
    """What changed, in words: records, classes, else the images or annotations themselves."""
    out = []
    if before["records"] != after["records"]:
        delta = after["records"] - before["records"]
        out.append(f"{abs(delta)} records {'more' if delta > 0 else 'fewer'}")
    old, new = before["names"], after["names"]
    if old != new:
        added = [n for n in new if n not in old]
        removed = [n for n in old if n not in new]
        if added or removed:
            parts = ([f"added {added[:5]}{'...' if len(added) > 5 else ''}"] if added else []) + (
                [f"removed {removed[:5]}{'...' if len(removed) > 5 else ''}"] if removed else []
            )
            out.append("classes " + ", ".join(parts))
        else:
            out.append("the same classes in another order (class ids now mean other classes)")
    if not out:
        out.append("the same record count and classes, but other image files or annotations")
    return out


def describe(snap: dict) -> str:
    fp = snap["fingerprint"][:_FP_SHOWN] or "not given"
    name = f"{snap['name']}, " if snap["name"] else ""
    return f"{name}fingerprint {fp}, {snap['records']} records, {len(snap['names'])} classes"


def refusal(before: dict, after: dict, *, endpoint: str, position: tuple[int, int]) -> SnapshotChangedError:
    """The error a trainer stops with when its daemon came back on another snapshot."""
    epoch, batch = position
    return SnapshotChangedError(
        f"the pixpool daemon at {endpoint} came back serving another snapshot: this trainer's stream began on "
        f"({describe(before)}), the daemon now serves ({describe(after)}): {'; '.join(differences(before, after))}. "
        f"Going on would cut epoch {epoch} short at batch {batch} and train on other data. Restart the daemon on the "
        "dataset this run began with, or start the run again on the new one; to go on with whatever the daemon serves, "
        "attach with follow_snapshot=True (pixpool train --follow-snapshot).",
        before=before,
        after=after,
    )


class StreamSnapshot:
    """The snapshot one trainer's stream is on: fixed at the first attach (``identity``);
    ``check`` refuses another one at a later attach, or follows it (``follow``)."""

    def __init__(self, *, follow: bool):
        self.follow = follow
        self.identity: dict = {}

    def check(self, attached: dict, *, endpoint: str, position: tuple[int, int]) -> None:
        """Raise ``SnapshotChangedError`` where ``attached`` serves another snapshot than the
        stream's, unless following; the caller detaches from that daemon first."""
        after = identity(attached)
        before = self.identity
        if before and changed(before, after):
            error = refusal(before, after, endpoint=endpoint, position=position)
            if not self.follow:
                raise error
            log.warning("following the daemon onto another snapshot (follow_snapshot=True): %s", error)
        self.identity = after
