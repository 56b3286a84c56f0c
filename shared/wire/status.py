"""The daemon's ``status`` and ``health`` replies as declared values.

Code both sides import: the daemon builds these (``server/daemon/``: the supervisor describes
its workers, the sessions their trainers, the daemon assembles them) and sends ``to_wire()``;
a reader (``pixpool status``, ``monitor``, ``memory``, the Ultralytics integration, the
benchmarks) decodes a reply with ``from_wire`` and reads attributes. ``to_wire()`` is the
msgpack map the ``status`` and ``health`` replies carry (``trainer.REPLIES``), key for key
and in the same order, so the wire and ``pixpool status --json`` stay what they were.

``from_wire`` is tolerant the way readers of these replies always were: a field a reply
leaves out takes its default (a daemon that does not say, or a test's partial reply), and
an optional field left out stays out of ``to_wire()``. A field of the wrong type is a
``ProtocolError`` naming it. The reply is bounded where it is made: the daemon lists
trainers up to ``TRAINERS_BUDGET_BYTES`` (``DaemonStatus.trainers_total`` says how many are
attached), and every reply is at most ``MAX_REPLY_BYTES`` (``trainer.encode_reply``).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..errors import ProtocolError
from ..stream.config import StreamSettings
from .trainer import DELIVERY_SHM, MAX_REPLY_BYTES, PROTOCOL_VERSION

__all__ = [
    "TRAINERS_BUDGET_BYTES",
    "DaemonStatus",
    "Health",
    "SnapshotStatus",
    "Status",
    "TrainerStatus",
    "WorkerStatus",
    "as_reply",
]

# Room for the trainer list in a status reply; the rest (daemon, snapshot, workers) is small.
TRAINERS_BUDGET_BYTES = MAX_REPLY_BYTES // 2

_NUMBER = (int, float)


def _take(cls: type, d: Any, what: str, types: Mapping[str, tuple[type, ...]], **nested: Any) -> dict[str, Any]:
    """The keyword arguments of ``cls`` from the map ``d``: each declared field ``d`` holds,
    checked against ``types`` (a field not named there is not checked) or decoded by ``nested``."""
    if not isinstance(d, Mapping):
        raise ProtocolError(f"status: {what} must be a map, got {type(d).__name__}")
    out = {}
    for f in dataclasses.fields(cls):
        if f.name not in d:
            continue
        value = d[f.name]
        if f.name in nested:
            value = nested[f.name](value)
        elif f.name in types and value is not None:
            ok = isinstance(value, types[f.name]) and (bool in types[f.name] or not isinstance(value, bool))
            if not ok:
                raise ProtocolError(f"status: {what}.{f.name} = {value!r:.40} has the wrong type", field=f.name)
        out[f.name] = value
    return out


def _tuple_of(decode, what: str):
    def one(value: Any) -> tuple:
        if not isinstance(value, (list, tuple)):
            raise ProtocolError(f"status: {what} must be a list, got {type(value).__name__}")
        return tuple(decode(v) for v in value)

    return one


@dataclass(frozen=True)
class DaemonStatus:
    """The daemon's settings and counters (a status reply's ``daemon``)."""

    pid: int = 0
    host: str = ""
    store: str | None = None  # None: a reply that does not say (readers take the default store)
    pid_ns: str = ""
    version: str = ""
    protocol: int = PROTOCOL_VERSION
    endpoint: str = ""
    tcp: str = ""
    uptime_s: float = 0.0
    worker_restarts: int = 0
    redispatched_jobs: int = 0
    heartbeat_timeout_s: float = 0.0
    memory_budget_nbytes: int | None = None
    store_warn_free_nbytes: int = 0
    store_low: bool = False
    metrics: str = ""  # the metrics endpoint's URL, empty without one
    trainers_total: int | None = None  # None: a reply that does not say (then every trainer is listed)
    # Periodic steps that failed with an OSError and were retried (``server/daemon/housekeeping.py``),
    # and TCP connections shut down before their handshake (``server/daemon/handshake_guard.py``).
    housekeeping_errors: int = 0
    tcp_handshakes_refused: int = 0

    def to_wire(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_wire(cls, d: Any) -> DaemonStatus:
        return cls(**_take(cls, d, "daemon", _DAEMON_TYPES))


_DAEMON_TYPES = {
    "pid": (int,),
    "host": (str,),
    "store": (str,),
    "pid_ns": (str,),
    "version": (str,),
    "protocol": (int,),
    "endpoint": (str,),
    "tcp": (str,),
    "uptime_s": _NUMBER,
    "worker_restarts": (int,),
    "redispatched_jobs": (int,),
    "heartbeat_timeout_s": _NUMBER,
    "memory_budget_nbytes": (int,),
    "store_warn_free_nbytes": (int,),
    "store_low": (bool,),
    "metrics": (str,),
    "trainers_total": (int,),
    "housekeeping_errors": (int,),
    "tcp_handshakes_refused": (int,),
}


# The fields a snapshot's status always has; the others are what the daemon knows of a
# prepared snapshot (``server/daemon/run.py``) and are left out where it knows nothing.
_SNAPSHOT_ALWAYS = ("records", "imgsz", "max_instances", "task")


@dataclass(frozen=True)
class SnapshotStatus:
    """One served split's snapshot (a status reply's ``snapshot``, and each of its ``splits``).

    ``segments`` are the store's files of it (its label indexes included); ``served`` says
    which files the split was read from (``shared.stream.served_data.describe``)."""

    records: int = 0
    imgsz: int | None = None
    max_instances: int | None = None
    task: str | None = None
    name: str | None = None
    content: str | None = None
    reused: bool | None = None
    prepare_s: float | None = None
    segments: tuple[str, ...] | None = None
    dtype: str | None = None
    store: str | None = None
    image_bytes: int | None = None
    index_bytes: int | None = None
    target_bytes: int | None = None
    polygon_bytes: int | None = None
    keypoint_bytes: int | None = None
    decoded_bytes: int | None = None
    classes: int | None = None
    served: Mapping[str, Any] | None = None

    def to_wire(self) -> dict[str, Any]:
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None and f.name not in _SNAPSHOT_ALWAYS:
                continue
            out[f.name] = list(value) if f.name == "segments" else dict(value) if f.name == "served" else value
        return out

    @classmethod
    def from_wire(cls, d: Any) -> SnapshotStatus:
        return cls(**_take(cls, d, "snapshot", _SNAPSHOT_TYPES, segments=_segments))


def _segments(value: Any) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(s, str) for s in value):
        raise ProtocolError("status: snapshot.segments must be a list of names", field="segments")
    return tuple(value)


_SNAPSHOT_TYPES = {
    "records": (int,),
    "imgsz": (int,),
    "max_instances": (int,),
    "task": (str,),
    "name": (str,),
    "content": (str,),
    "reused": (bool,),
    "prepare_s": _NUMBER,
    "dtype": (str,),
    "store": (str,),
    "image_bytes": (int,),
    "index_bytes": (int,),
    "target_bytes": (int,),
    "polygon_bytes": (int,),
    "keypoint_bytes": (int,),
    "decoded_bytes": (int,),
    "classes": (int,),
    "served": (dict,),
}


@dataclass(frozen=True)
class WorkerStatus:
    """One augmentation worker (an entry of a status reply's ``workers``); ``pid`` 0 while none runs."""

    index: int = 0
    pid: int = 0
    state: str = ""
    parts_done: int = 0
    samples_done: int = 0
    busy_s: float = 0.0
    ready_s: float = 0.0

    @property
    def ready(self) -> bool:
        """Started and taking jobs."""
        return self.state in ("idle", "busy")

    def to_wire(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_wire(cls, d: Any) -> WorkerStatus:
        return cls(**_take(cls, d, "worker", _WORKER_TYPES))


_WORKER_TYPES = {
    "index": (int,),
    "pid": (int,),
    "state": (str,),
    "parts_done": (int,),
    "samples_done": (int,),
    "busy_s": _NUMBER,
    "ready_s": _NUMBER,
}


@dataclass(frozen=True)
class TrainerStatus:
    """One attached session (an entry of a status reply's ``trainers``): a trainer's training
    stream, or its validation pass (``split`` val; ``of_trainer`` is then the trainer it belongs
    to, 0 when none is attached)."""

    trainer_id: int = 0
    pid: int = 0
    host: str = ""
    delivery: str = ""
    pid_watched: bool | None = None  # None: a reply that does not say (``watched``)
    # Its stream settings as the wire carries them (``StreamSettings.to_dict``; ``settings`` reads
    # them): a status lists up to thousands of trainers, several times a second with metrics on,
    # and the daemon keeps this map from the attach, so neither side re-encodes nor re-checks
    # what no reader asks for.
    settings_wire: Mapping[str, Any] = field(default_factory=dict)
    split: str = "train"
    of_trainer: int = 0
    epoch: int = 0
    next_batch: int = 0
    num_batches: int = 0
    batches_delivered: int = 0
    images_delivered: int = 0
    img_per_s: float = 0.0
    slots: int = 0
    slots_in_use: int = 0
    ring: str = ""
    ring_nbytes: int = 0
    # Of which mask planes (segment; 0 otherwise): counted in ring_nbytes, named apart.
    ring_mask_nbytes: int = 0
    last_seen_s: float = 0.0
    attached_s: float = 0.0
    data_wait_s: float = 0.0

    @functools.cached_property
    def settings(self) -> StreamSettings:
        """The stream's settings; a ProtocolError where the reply's map is no valid settings."""
        try:
            return StreamSettings.from_dict(dict(self.settings_wire))
        except Exception as exc:  # a ConfigError or a TypeError from a malformed map: the reply's fault
            raise ProtocolError(f"status: trainer.settings: {exc}", field="settings") from None

    @property
    def is_validation(self) -> bool:
        """A session that streams the val split: a trainer's validation pass, not a trainer."""
        return self.split != "train"

    @property
    def watched(self) -> bool:
        """Its pid is this machine's and the daemon's PID namespace's (measurable by pid here);
        a reply that does not say: whether it maps its ring."""
        return self.pid_watched if self.pid_watched is not None else self.delivery == DELIVERY_SHM

    @property
    def wait_share(self) -> float:
        """The share of its attachment it spent waiting for batches, 0 to 1: wait and time over
        the same span (a trainer of this release counts its wait from its latest attach; one of
        an older release counts it from its first, so a share over 1 is theirs, and capped)."""
        return min(1.0, self.data_wait_s / self.attached_s) if self.attached_s > 0 else 0.0

    def to_wire(self) -> dict[str, Any]:
        out = {}
        for f in dataclasses.fields(self):
            if f.name == "settings_wire":
                out["settings"] = dict(self.settings_wire)
            elif f.name != "pid_watched" or self.pid_watched is not None:
                out[f.name] = getattr(self, f.name)
        return out

    @classmethod
    def from_wire(cls, d: Any) -> TrainerStatus:
        out = _take(cls, d, "trainer", _TRAINER_TYPES)
        out.pop("settings_wire", None)  # on the wire it is ``settings``
        if "settings" in d:
            if not isinstance(d["settings"], Mapping):
                raise ProtocolError("status: trainer.settings must be a map", field="settings")
            out["settings_wire"] = d["settings"]
        return cls(**out)


_TRAINER_TYPES = {
    "trainer_id": (int,),
    "pid": (int,),
    "host": (str,),
    "delivery": (str,),
    "pid_watched": (bool,),
    "split": (str,),
    "of_trainer": (int,),
    "epoch": (int,),
    "next_batch": (int,),
    "num_batches": (int,),
    "batches_delivered": (int,),
    "images_delivered": (int,),
    "img_per_s": _NUMBER,
    "slots": (int,),
    "slots_in_use": (int,),
    "ring": (str,),
    "ring_nbytes": (int,),
    "ring_mask_nbytes": (int,),
    "last_seen_s": _NUMBER,
    "attached_s": _NUMBER,
    "data_wait_s": _NUMBER,
}


@dataclass(frozen=True)
class Status:
    """The daemon's ``status`` reply: itself, its snapshots, workers and (as many as fit) trainers."""

    daemon: DaemonStatus = field(default_factory=DaemonStatus)
    snapshot: SnapshotStatus = field(default_factory=SnapshotStatus)  # the training split's
    splits: Mapping[str, SnapshotStatus] | None = None  # None: a reply that does not say (see ``served``)
    workers: tuple[WorkerStatus, ...] = ()
    trainers: tuple[TrainerStatus, ...] = ()

    @property
    def served(self) -> Mapping[str, SnapshotStatus]:
        """Split -> snapshot of every split the daemon serves (the training one where it does not say)."""
        return self.splits or {"train": self.snapshot}

    @property
    def trainers_unlisted(self) -> int:
        """Sessions attached but not listed (the reply's size limit), 0 where the daemon does not say."""
        total = self.daemon.trainers_total
        return 0 if total is None else total - len(self.trainers)

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"daemon": self.daemon.to_wire(), "snapshot": self.snapshot.to_wire()}
        if self.splits is not None:
            out["splits"] = {k: v.to_wire() for k, v in self.splits.items()}
        out["workers"] = [w.to_wire() for w in self.workers]
        out["trainers"] = [t.to_wire() for t in self.trainers]
        return out

    @classmethod
    def from_wire(cls, d: Any) -> Status:
        return cls(
            **_take(
                cls,
                d,
                "status",
                {},
                daemon=DaemonStatus.from_wire,
                snapshot=SnapshotStatus.from_wire,
                splits=_splits,
                workers=_tuple_of(WorkerStatus.from_wire, "workers"),
                trainers=_tuple_of(TrainerStatus.from_wire, "trainers"),
            )
        )


def _splits(value: Any) -> dict[str, SnapshotStatus] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ProtocolError(f"status: splits must be a map, got {type(value).__name__}", field="splits")
    return {str(k): SnapshotStatus.from_wire(v) for k, v in value.items()}


@dataclass(frozen=True)
class Health:
    """The daemon's ``health`` reply: alive (it answered), healthy (serving, not stopping), counts.
    Its cost does not grow with the sessions, which is what a probe asking every few seconds needs."""

    pid: int = 0
    healthy: bool = False
    trainers: int = 0  # training streams: a trainer's validation pass is no trainer
    workers_ready: int = 0
    uptime_s: float = 0.0

    def to_wire(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_wire(cls, d: Any) -> Health:
        return cls(**_take(cls, d, "health", _HEALTH_TYPES))


_HEALTH_TYPES = {"pid": (int,), "healthy": (bool,), "trainers": (int,), "workers_ready": (int,), "uptime_s": _NUMBER}


def as_reply(op: str, value: Status | Health) -> dict[str, Any]:
    """``value`` as its reply frame decodes (``trainer.decode``: version and op first): what
    ``pixpool status --json`` and ``monitor --json`` print."""
    return {"v": PROTOCOL_VERSION, "op": str(op), **value.to_wire()}
