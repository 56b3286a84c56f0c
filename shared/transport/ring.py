"""A trainer's batch ring: K fixed-size batch slots in one shared-memory segment.

Who runs what: the daemon creates the ring when a trainer attaches (``Ring.create``) and is
the only process that unlinks it (on detach, trainer death or shutdown). Workers attach it
by name and render *parts* of a batch (runs of sample positions) straight into a slot, all
workers into the same slot at once; the daemon, once every part of a slot is in, packs the
targets and writes the slot header, then announces it. The trainer attaches the ring by
name and reads slots in place. Nobody else writes it.

Layout (all offsets 64-byte aligned, slots 4096-byte aligned)::

    ring header (4096 bytes): magic b"PXRING02", then int64 slots, slot_nbytes, batch_size,
                              imgsz, max_targets, target_width, mask_side, mask itemsize
    slot k at 4096 + k * slot_nbytes:
        slot header (64 bytes): int64 epoch, batch, size, n_targets, generation
                                (written last, by the daemon, once per announcement)
        images   uint8   (batch_size, 3, imgsz, imgsz)   RGB, C-contiguous
        targets  float32 (batch_size * per_sample, W)    (batch_index, class, cx, cy, w, h, task columns)
        masks    uint8 or int32 (batch_size, M, M)       segment only (M = mask_side > 0), else no bytes
        samples  int64   (batch_size,)

Per task (``shared/task.py``): a row has ``target_width`` W columns (6 for detect
and segment, 7 for obb, 6 + 3K for pose), and a segment ring has one mask plane of
``mask_side`` pixels a side per sample position, Ultralytics' overlap layout: 0 background,
instance k of the sample numbered k (1..n). Its dtype is ``mask_dtype``: uint8 while a
sample can have at most 255 instances (``per_sample``), else int32, so a plane holds every
number a sample can need. A detect ring has exactly the bytes and offsets it always had
(W = 6, no plane).

Targets: while a slot is rendered, sample position p owns rows ``p * per_sample`` onwards
(``per_sample = ceil(max_targets / batch_size)``), so workers write their samples' rows
without knowing how many rows the samples before them have. ``pack_targets`` then moves
every sample's rows down to follow the previous sample's (in place, in sample order: a
destination never lies after its source), so the trainer reads ``n_targets`` contiguous
rows in sample order, as if one process had rendered the whole batch.

Backpressure is credit based and lives in the daemon's scheduler: a slot is either free
(the daemon may give its parts to workers), rendering, announced, or held by the trainer
until it sends ``release``. Every worker fills the same slot, so a trainer needs no slot
per worker: ``DEFAULT_SLOTS`` = ``MAX_SLOTS`` = 3 (one read by the trainer, one rendered,
one finished or starting), and a trainer costs the service exactly ``nbytes`` of this
segment: 3 batches of images plus their target rows, mask planes (segment), samples and headers.

Locality: the ring header also holds a random nonce at ``NONCE_OFFSET``, written by the
daemon at creation and never sent over a socket. A trainer that reads it back through the
store path it was told has proved it maps this very file (same store, whatever its host
name or PID namespace), and the daemon then delivers batches in place; otherwise as frames.

Holds (``shared.transport.holds``): the daemon's mapping holds the ring's ``CREATOR`` lock and the
trainer's its ``CONSUMER`` lock, for as long as each maps it, in whatever PID namespace.
So a trainer knows its daemon is gone when the creator lock is (``daemon_alive``), and a
ring nobody holds is a dead daemon's leftover, whatever pid its name carries: the trainer
that moves on is the last one out and removes it (``leave``), and every daemon sweeps
such rings (``server.daemon.sweeps.sweep_rings``).

The segment is a ``shared.transport.shm.SharedSegment`` (a file in the daemon's store, never registered with
multiprocessing's resource tracker: bpo-39959). Its whole size is reserved at creation,
so a full /dev/shm is a clear ``CapacityError`` now rather than a SIGBUS in a worker later,
and the ring's cost shows in /dev/shm at once.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..errors import CapacityError, ConfigError, RingGoneError, SnapshotError
from ..task import BASE_COLUMNS
from . import holds
from .shm import SharedSegment, unlink_segment
from .store import DEFAULT, Store, free_nbytes

log = logging.getLogger(__name__)

# 02: the header names the target width and the mask plane (segment, pose, obb).
MAGIC = b"PXRING02"
RING_HEADER_NBYTES = 4096
SLOT_HEADER_NBYTES = 64
_HEADER = struct.Struct("<8s8q")
_SLOT_HEADER = struct.Struct("<5q")
# A ring holds at least two slots (one being read, one being written) and at most three:
# all workers render into one slot together, so a third only covers the hand-over between
# batches; more would cost a batch of memory each and feed the trainer no faster.
MIN_SLOTS, MAX_SLOTS = 2, 3
DEFAULT_SLOTS = 3
# The locality nonce: 16 random bytes in the ring header, past the fields above.
NONCE_OFFSET, NONCE_NBYTES = 2048, 16
# A mask plane's dtypes, by name (as the layout travels) and their item sizes (as the header holds them).
MASK_DTYPES = {"uint8": 1, "int32": 4}
_DTYPE_OF_ITEMSIZE = {size: name for name, size in MASK_DTYPES.items()}
BASE_TARGET_WIDTH = BASE_COLUMNS  # a detect row; every task's row starts with these
# The most instances a uint8 plane can number (0 is the background).
UINT8_INSTANCES = 255
_FIELDS = ("slots", "batch_size", "imgsz", "max_targets", "target_width", "mask_side", "mask_dtype")
_REQUIRED = frozenset(_FIELDS[:4])


def _align(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def mask_dtype_for(per_sample: int) -> str:
    """The plane dtype that numbers ``per_sample`` instances: uint8 up to 255, else int32
    (as Ultralytics' overlap masks switch to int32 past 255 instances)."""
    return "uint8" if per_sample <= UINT8_INSTANCES else "int32"


@dataclass(frozen=True)
class RingLayout:
    """Sizes of one ring; travels in the ``attached`` reply as a plain dict."""

    slots: int
    batch_size: int
    imgsz: int
    max_targets: int
    target_width: int = BASE_TARGET_WIDTH  # columns of a target row (``TaskSpec.target_width``)
    mask_side: int = 0  # pixels a side of a sample's mask plane; 0: no masks (every task but segment)
    mask_dtype: str = "uint8"  # the plane's dtype: ``mask_dtype_for(per_sample)``

    def __post_init__(self) -> None:
        for name in ("slots", "batch_size", "imgsz", "max_targets", "target_width", "mask_side"):
            value = getattr(self, name)
            least = 0 if name == "mask_side" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                kind = "an integer >= 0" if least == 0 else "a positive integer"
                raise ConfigError(f"ring layout field {name!r} must be {kind}, got {value!r}")
        if not MIN_SLOTS <= self.slots <= MAX_SLOTS:
            raise ConfigError(
                f"ring of {self.slots} slots: use {MIN_SLOTS} to {MAX_SLOTS} (each slot holds one whole batch, which all workers render together)"
            )
        if self.target_width < BASE_TARGET_WIDTH:
            raise ConfigError(
                f"ring layout field 'target_width' is {self.target_width}: a target row has at least the "
                f"{BASE_TARGET_WIDTH} columns (batch_index, class, cx, cy, w, h)"
            )
        if self.mask_dtype not in MASK_DTYPES:
            raise ConfigError(f"ring layout field 'mask_dtype' is {self.mask_dtype!r}; use one of {list(MASK_DTYPES)}")
        if self.mask_side and self.mask_dtype == "uint8" and self.per_sample > UINT8_INSTANCES:
            raise ConfigError(
                f"a uint8 mask plane numbers at most {UINT8_INSTANCES} instances, but a sample of this ring may have "
                f"{self.per_sample} (max_targets {self.max_targets} over batch {self.batch_size}); "
                "use mask_dtype 'int32'"
            )

    @property
    def images_nbytes(self) -> int:
        return self.batch_size * 3 * self.imgsz * self.imgsz

    @property
    def images_offset(self) -> int:
        return SLOT_HEADER_NBYTES

    @property
    def targets_offset(self) -> int:
        return _align(self.images_offset + self.images_nbytes, 64)

    @property
    def per_sample(self) -> int:
        """Target rows each sample position may fill while the slot is rendered."""
        return -(-self.max_targets // self.batch_size)

    @property
    def target_rows(self) -> int:
        """Rows of a slot's target area (>= ``max_targets``): ``batch_size`` regions of ``per_sample``."""
        return self.batch_size * self.per_sample

    @property
    def row_nbytes(self) -> int:
        return self.target_width * 4

    @property
    def has_masks(self) -> bool:
        return self.mask_side > 0

    @property
    def mask_itemsize(self) -> int:
        return MASK_DTYPES[self.mask_dtype]

    @property
    def masks_offset(self) -> int:
        return _align(self.targets_offset + self.target_rows * self.row_nbytes, 64)

    @property
    def masks_nbytes(self) -> int:
        """Bytes of a slot's mask planes (0 without masks)."""
        return self.batch_size * self.mask_side * self.mask_side * self.mask_itemsize

    @property
    def samples_offset(self) -> int:
        # Without masks this is where it always was: right after the target rows.
        return _align(self.masks_offset + self.masks_nbytes, 64)

    @property
    def slot_nbytes(self) -> int:
        return _align(self.samples_offset + self.batch_size * 8, 4096)

    @property
    def nbytes(self) -> int:
        return RING_HEADER_NBYTES + self.slots * self.slot_nbytes

    def to_dict(self) -> dict[str, int | str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RingLayout":
        """The layout of an ``attached`` reply; ``target_width``, ``mask_side`` and ``mask_dtype``
        may be left out (a detect ring's defaults)."""
        if not isinstance(data, dict) or not _REQUIRED <= set(data) or not set(data) <= set(_FIELDS):
            raise ConfigError(
                f"ring layout must be a map of {', '.join(sorted(_REQUIRED))} (and optionally "
                f"{', '.join(f for f in _FIELDS if f not in _REQUIRED)}); got {data!r:.300}"
            )
        return cls(**data)


class Ring:
    """One mapped batch ring. ``create`` in the daemon, ``attach`` elsewhere.

    ``close()`` when this process is done with it; ``unlink()`` once, by the daemon only.
    """

    def __init__(self, segment: SharedSegment, layout: RingLayout):
        self.name = segment.name
        self.store = segment.store
        self.layout = layout
        self.owner = segment.owner
        self._segment: SharedSegment | None = segment
        self._buf = np.frombuffer(segment.buf, dtype=np.uint8)

    @classmethod
    def create(cls, name: str, layout: RingLayout, *, store: Store = DEFAULT) -> "Ring":
        try:
            segment = SharedSegment.create(name, layout.nbytes, reserve=True, store=store)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.ENOMEM):
                raise CapacityError(
                    f"batch ring {name} needs {layout.nbytes} bytes but the store {store} has {free_nbytes(store)} free; "
                    f"use fewer slots, a smaller batch or imgsz, or enlarge {store}"
                ) from None
            raise
        segment.buf[: _HEADER.size] = _HEADER.pack(
            MAGIC,
            layout.slots,
            layout.slot_nbytes,
            layout.batch_size,
            layout.imgsz,
            layout.max_targets,
            layout.target_width,
            layout.mask_side,
            layout.mask_itemsize,
        )
        segment.buf[NONCE_OFFSET : NONCE_OFFSET + NONCE_NBYTES] = os.urandom(NONCE_NBYTES)
        return cls(segment, layout)

    @classmethod
    def attach(cls, name: str, *, store: Store = DEFAULT, trainer: bool = False) -> "Ring":
        """Map the ring ``name``: a worker's mapping, or with ``trainer`` the mapping of the
        trainer it is for (its hold says so: ``holds.CONSUMER``)."""
        try:
            segment = SharedSegment.attach(name, writable=True, store=store, consumer=trainer)
        except FileNotFoundError:
            raise RingGoneError(f"batch ring {name} does not exist (the daemon removed it or stopped)") from None
        size = segment.nbytes
        if size < RING_HEADER_NBYTES:
            segment.close()
            raise SnapshotError(f"batch ring {name} has {size} bytes, less than its {RING_HEADER_NBYTES}-byte header")
        magic, slots, slot_nbytes, batch_size, imgsz, max_targets, width, side, itemsize = _HEADER.unpack_from(
            segment.buf, 0
        )
        if magic != MAGIC:
            segment.close()
            raise SnapshotError(
                f"segment {name} is not a pixpool batch ring (magic {magic!r}, expected {MAGIC!r}): another file, "
                "or a ring of another pixpool release; run the same release in the daemon and the trainer"
            )
        try:
            layout = RingLayout(
                slots=slots,
                batch_size=batch_size,
                imgsz=imgsz,
                max_targets=max_targets,
                target_width=width,
                mask_side=side,
                mask_dtype=_DTYPE_OF_ITEMSIZE.get(itemsize, f"itemsize {itemsize}"),
            )
        except ConfigError as exc:
            segment.close()
            raise SnapshotError(f"batch ring {name} has a header no layout fits: {exc}") from None
        if layout.slot_nbytes != slot_nbytes or layout.nbytes > size:
            segment.close()
            raise SnapshotError(
                f"batch ring {name}: header says {slots} slots of {slot_nbytes} bytes but the segment has {size} bytes"
            )
        return cls(segment, layout)

    def nonce(self) -> str:
        """The locality nonce (hex) as this mapping sees it (module docstring)."""
        return bytes(self._buf[NONCE_OFFSET : NONCE_OFFSET + NONCE_NBYTES]).hex()

    # -- slot views -------------------------------------------------------------------
    def _slot_base(self, slot: int) -> int:
        if isinstance(slot, bool) or not 0 <= slot < self.layout.slots:
            raise IndexError(f"slot {slot} outside ring {self.name} of {self.layout.slots} slots")
        return RING_HEADER_NBYTES + slot * self.layout.slot_nbytes

    def images(self, slot: int, size: int | None = None) -> np.ndarray:
        lay = self.layout
        n = lay.batch_size if size is None else size
        start = self._slot_base(slot) + lay.images_offset
        return self._buf[start : start + n * 3 * lay.imgsz * lay.imgsz].reshape(n, 3, lay.imgsz, lay.imgsz)

    def targets(self, slot: int, n_targets: int | None = None) -> np.ndarray:
        """The first ``n_targets`` rows of a slot's target area (all of it by default)."""
        lay = self.layout
        n = lay.target_rows if n_targets is None else n_targets
        if not 0 <= n <= lay.target_rows:
            raise IndexError(f"{n} target rows asked of ring {self.name}, whose slots hold {lay.target_rows}")
        start = self._slot_base(slot) + lay.targets_offset
        return self._buf[start : start + n * lay.row_nbytes].view(np.float32).reshape(n, lay.target_width)

    def sample_targets(self, slot: int, position: int, n_targets: int) -> np.ndarray:
        """Rows of sample ``position`` while the slot is rendered (before ``pack_targets``)."""
        lay = self.layout
        if not 0 <= position < lay.batch_size or not 0 <= n_targets <= lay.per_sample:
            raise IndexError(
                f"sample {position} with {n_targets} target rows: ring {self.name} holds {lay.per_sample} rows for each of {lay.batch_size} samples"
            )
        start = self._slot_base(slot) + lay.targets_offset + position * lay.per_sample * lay.row_nbytes
        rows = self._buf[start : start + n_targets * lay.row_nbytes].view(np.float32)
        return rows.reshape(n_targets, lay.target_width)

    def pack_targets(self, slot: int, counts: list[int]) -> int:
        """Move each sample's rows (``counts[p]`` at position p's region) to follow the rows
        of the samples before it; returns the total. Runs in the daemon, once every part
        of the slot is in and before the header is written."""
        lay = self.layout
        if len(counts) > lay.batch_size or any(not 0 <= c <= lay.per_sample for c in counts):
            raise ValueError(
                f"target counts {list(counts)} do not fit ring {self.name}: {lay.batch_size} samples of at most {lay.per_sample} rows"
            )
        area = self.targets(slot)
        n = 0
        for p, c in enumerate(counts):
            src = p * lay.per_sample
            if c and src != n:  # n <= src: never overwrites rows not yet moved
                area[n : n + c] = area[src : src + c]
            n += c
        return n

    def masks(self, slot: int, size: int | None = None) -> np.ndarray | None:
        """The mask planes of the first ``size`` sample positions (all by default), (size, M, M)
        of ``mask_dtype``; None for a ring without masks (every task but segment)."""
        lay = self.layout
        if not lay.has_masks:
            return None
        n = lay.batch_size if size is None else size
        if not 0 <= n <= lay.batch_size:
            raise IndexError(f"{n} mask planes asked of ring {self.name}, whose slots hold {lay.batch_size}")
        m = lay.mask_side
        start = self._slot_base(slot) + lay.masks_offset
        return self._buf[start : start + n * m * m * lay.mask_itemsize].view(lay.mask_dtype).reshape(n, m, m)

    def samples(self, slot: int, size: int | None = None) -> np.ndarray:
        lay = self.layout
        n = lay.batch_size if size is None else size
        start = self._slot_base(slot) + lay.samples_offset
        return self._buf[start : start + n * 8].view(np.int64)

    def write_header(self, slot: int, *, epoch: int, batch: int, size: int, n_targets: int, generation: int) -> None:
        base = self._slot_base(slot)
        self._buf[base : base + _SLOT_HEADER.size] = np.frombuffer(
            _SLOT_HEADER.pack(epoch, batch, size, n_targets, generation), np.uint8
        )

    def read_header(self, slot: int) -> tuple[int, int, int, int, int]:
        """(epoch, batch, size, n_targets, generation) as the daemon last announced them."""
        base = self._slot_base(slot)
        return _SLOT_HEADER.unpack(self._buf[base : base + _SLOT_HEADER.size].tobytes())

    # -- lifetime ---------------------------------------------------------------------
    def close(self, *, let_go: bool = False) -> None:
        """Unmap; where numpy views of the slots are still alive, the mapping goes with them
        (and its hold with it, unless ``let_go``: ``SharedSegment.close``)."""
        if self._segment is None:
            return
        segment, self._segment = self._segment, None
        self._buf = None  # type: ignore[assignment]
        segment.close(let_go=let_go)

    def leave(self) -> str:
        """Close, and as the last process out remove the ring (``holds.remove_unused``):
        what a trainer does when it moves on. Its daemon, while alive, still maps the ring,
        so this removes only a ring whose daemon is gone. Returns what ``remove_unused`` says."""
        name, store = self.name, self.store
        self.close(let_go=True)
        return holds.remove_unused([name], store)

    def daemon_alive(self) -> bool:
        """True while the daemon that created this ring still maps it (its ``CREATOR`` hold),
        seen from any PID namespace. Not meaningful in the daemon itself."""
        return self._segment is not None and self._segment.held_by_others(holds.CREATOR)

    def trainer_holds(self) -> bool:
        """True while the trainer this ring is for maps it (its ``CONSUMER`` hold)."""
        return self._segment is not None and self._segment.held_by_others(holds.CONSUMER)

    def unlink(self) -> None:
        if not self.owner:
            raise SnapshotError(f"only the daemon that created batch ring {self.name} unlinks it")
        unlink_segment(self.name, self.store)

    @property
    def closed(self) -> bool:
        return self._segment is None

    def present(self) -> bool:
        """True while the store still holds this ring's file (``SharedSegment.present``)."""
        return self._segment is not None and self._segment.present()

    def __enter__(self) -> "Ring":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
