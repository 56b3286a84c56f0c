"""How a training epoch's loss is written for a person: Ultralytics' three terms, then the total.

Runs in the trainer's or the demo's process (``pixpool train``, ``pixpool demo``). The terms
``box``, ``cls`` and ``dfl`` are each after its gain, per batch, as Ultralytics' progress bar
shows ``box_loss``, ``cls_loss`` and ``dfl_loss`` (a few units each); the total a step calls
``backward`` on is their sum times the batch size (``detect/loss.py``), tens to hundreds, and
is said as such so that it is not read on their scale.
"""

from __future__ import annotations

__all__ = ["loss_text"]


def loss_text(row: dict, *, batch_size: int) -> str:
    """``box 1.234 cls 2.345 dfl 1.111 (total 37.52 = sum x batch 8)`` from an epoch's row
    (``fit``'s ``results.jsonl`` line); the total alone for a row without the terms."""
    if not all(k in row for k in ("box", "cls", "dfl")):
        return f"loss {row['loss']:.3f}"
    return (
        f"box {row['box']:.3f} cls {row['cls']:.3f} dfl {row['dfl']:.3f} "
        f"(total {row['loss']:.2f} = sum x batch {batch_size})"
    )
