"""``Batch``: what ``attach()`` yields: ``images, targets`` with the batch's record indices, files,
epoch and position (and a segment batch's masks), in a shape the collection utilities of trainers
rebuild without loss.

Runs in the trainer process. Trainers move and convert batches with generic utilities that
take a collection apart, transform each element and build the same type again:

- Lightning's ``move_data_to_device`` / ``apply_to_collection``: ``type(b)(*items)`` for a
  named tuple (it checks ``_fields`` and ``_asdict``), ``type(b)(items)`` for another sequence
  (and ``b.to(device)`` first, where ``b`` has a ``to``);
- torch's ``pin_memory`` (the DataLoader's ``pin_memory=True``): ``type(b)(*items)`` for a
  named tuple, ``type(b)(items)`` for another tuple; ``default_convert`` (a DataLoader
  without batching): ``type(b)(*items)`` for a named tuple, a plain list for another tuple.

Whatever an element-wise rebuild passes to the constructor is all the new batch gets: extra
tuple elements would be rebuilt too, but a batch must unpack as exactly ``images, targets``
(every DataLoader loop does), and instance attributes beside the two elements are dropped.
So the tuple holds the two tensors, which the utilities should move, and the batch's
metadata lives on its type: each batch is an instance of a small subclass of ``Batch``
made for it, whose class attributes are ``indices``, ``files``, ``epoch``, ``batch`` and
``masks`` (segment: the (B, M, M) mask planes; None for the other tasks).
``type(b)(*items)``, ``type(b)(items)``, ``b._replace(...)``, ``copy`` and pickling
all keep them, and ``isinstance(b, Batch)`` holds. So the utilities do not move ``masks``
with the two tensors: a trainer moves them itself (Ultralytics' ``preprocess_batch`` does).
A subclass per batch costs a few microseconds against milliseconds of copying the batch;
``torch.compile`` of a function that takes the whole batch would see a new input type each
step (pass it the tensors).
"""

from __future__ import annotations

from collections import namedtuple
from typing import Any

__all__ = ["Batch"]

_META = ("indices", "files", "epoch", "batch", "masks")
_UNSET = object()


class Batch(namedtuple("Batch", ("images", "targets"))):
    """``(images, targets)``, with ``indices`` (record indices), ``files`` (their image files),
    ``epoch``, ``batch`` (its position in the epoch) and ``masks`` (segment) as attributes; see
    the module docstring."""

    __slots__ = ()
    indices: Any = None
    files: tuple[str, ...] | list[str] = ()
    epoch: int | None = None
    batch: int | None = None
    masks: Any = None

    def __new__(cls, images, targets=_UNSET, /, **meta: Any):
        if targets is _UNSET:  # ``type(b)(items)``: one iterable of the two elements
            images, targets = _two(images)
        unknown = sorted(set(meta) - set(_META))
        if unknown:
            raise TypeError(f"Batch() got unexpected keyword arguments {unknown}; it takes {list(_META)}")
        if meta:
            cls = _batch_type({k: meta.get(k, getattr(cls, k)) for k in _META})
        return super().__new__(cls, images, targets)

    def __reduce__(self):
        return _restore, (self.images, self.targets, {k: getattr(self, k) for k in _META})

    def __repr__(self) -> str:
        shapes = f"images={_shape(self.images)}, targets={_shape(self.targets)}"
        if self.masks is not None:
            shapes += f", masks={_shape(self.masks)}"
        return f"Batch(epoch={self.epoch}, batch={self.batch}, {shapes})"


def _two(items) -> tuple[Any, Any]:
    items = tuple(items)
    if len(items) != 2:
        raise TypeError(f"a Batch is (images, targets); got {len(items)} items")
    return items[0], items[1]


def _batch_type(meta: dict[str, Any]) -> type[Batch]:
    """A subclass of ``Batch`` whose class attributes are one batch's metadata."""
    return type("Batch", (Batch,), {"__slots__": (), "__module__": __name__, **meta})


def _restore(images, targets, meta: dict[str, Any]) -> Batch:
    return Batch(images, targets, **meta)


def _shape(value: Any) -> str:
    shape = getattr(value, "shape", None)
    return f"{type(value).__name__}{tuple(shape)}" if shape is not None else type(value).__name__
