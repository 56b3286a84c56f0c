"""The image file of every record the daemon serves, fetched when first asked for, not at attach.

Runs in the trainer process. An attach carries no per-record data: its ``attached`` reply
names the record count, and its size is the same for 100 records or a million. A
``RecordFiles`` stands for the split's names from then on: the first read (a batch's
``files``, ``loader.files[i]``, ``len(loader.files)``) fetches them all once, page by page,
kept as one buffer (``shared/stream/path_table.py``). At 100k records
that fetch took 16 ms; made at attach it was paid by every trainer, whether it looked at a
name or not, and grew with the set (``docs/scale.md``).

The fetch runs on a socket of its own (``fetch_files``), opened for it and closed after: the
main socket carries the stream's ``ready`` messages, which a wait for other replies would
skip, so a fetch in the middle of an epoch must not read from it. ``records`` is a request
open to any peer (no session), bounded as every request is (``shared/wire/trainer.py``): the
trainer asks ``packed`` pages from ``start`` on; each reply carries at most
``RECORDS_PAGE_BYTES`` of names. A daemon of an earlier release ignores ``packed`` and
answers with lists of at most ``RECORDS_PAGE`` names; both come back as one ``PathTable``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import overload

import numpy as np

from ..shared.errors import SnapshotError
from ..shared.stream.path_table import PathTable
from .connection import KEEP_WAITING, Connection

__all__ = ["RecordFiles", "fetch_files", "fetch_records"]


class _NoSession:
    """The ``connection.Peer`` of a socket that holds no session: nothing to lose but the
    deadline (the Client's own checks of its daemon run on its main socket)."""

    ident = None

    def daemon_gone(self) -> bool:
        return False

    def daemon_answers(self) -> bool:
        return False


def fetch_files(conn: Connection, *, split: str, records: int, deadline: float) -> PathTable:
    """Every image file name of ``split``, in record order, over ``conn``; ``records``: the
    count the stream attached with (another count means the daemon serves other data now)."""
    return fetch_records(conn, split=split, records=records, deadline=deadline)[0]


def fetch_records(
    conn: Connection, *, split: str, records: int, deadline: float, sizes: bool = False
) -> tuple[PathTable, np.ndarray | None]:
    """``fetch_files``'s names and, with ``sizes``, each record's decoded (height, width) as
    int64 (n, 2), what rect validation batches are planned from; None where the daemon keeps
    none (or is of a release before them)."""
    chunks: list[bytes] = []
    size_chunks: list[bytes] | None = [] if sizes else None
    count = 0

    def page(msg: dict, frames: list):
        return msg if msg["start"] == count else KEEP_WAITING

    while True:
        conn.send("records", start=count, split=split, packed=True, **({"sizes": True} if sizes else {}))
        msg = conn.wait({"records": page}, deadline=deadline, what="reply to records", peer=_NoSession())
        if msg["total"] == 0:  # a daemon whose source was not read from files names none
            return PathTable.from_packed(b""), None
        if msg["total"] != records:
            raise SnapshotError(
                f"the pixpool daemon at {conn.endpoint} now serves {msg['total']} records as its {split!r} split, "
                f"this stream attached to {records}: it was restarted on other data; the stream stops at its next "
                "batch (or follows it with follow_snapshot=True), ask for file names after that"
            )
        if "packed" in msg:
            got = int(msg.get("count", 0))
            chunks.append(msg["packed"])
            if size_chunks is not None:
                page_sizes = msg.get("sizes")
                if not isinstance(page_sizes, bytes) or len(page_sizes) != 8 * got:
                    size_chunks = None  # the daemon keeps no sizes (or sent a page without them): plan from headers
                else:
                    size_chunks.append(page_sizes)
        else:
            got = len(msg["files"])
            chunks.append(PathTable.from_paths(msg["files"]).data)
        count += got
        if count >= msg["total"] or not got:
            shapes = None
            if size_chunks is not None:
                shapes = np.frombuffer(b"".join(size_chunks), dtype="<i4").astype(np.int64).reshape(-1, 2)
            return PathTable.from_packed(b"".join(chunks)), shapes


class RecordFiles(Sequence[str]):
    """The image file of each record of one attachment's split, in record order: a read-only
    sequence of ``records`` paths whose first read (``len()`` included) calls ``fetch`` once
    (module docstring); empty where the daemon names no files (a source it was handed in
    memory rather than read from files)."""

    def __init__(
        self,
        records: int,
        fetch: Callable[[], PathTable],
        *,
        fetch_sizes: Callable[[], tuple[PathTable, np.ndarray | None]] | None = None,
    ):
        self._records = int(records)
        self._fetch = fetch
        self._fetch_sizes = fetch_sizes
        self._table: PathTable | None = None
        self._sizes: np.ndarray | None = None
        self._sizes_asked = False
        self._lock = threading.Lock()  # two threads reading at once fetch once

    @property
    def fetched(self) -> bool:
        """Whether the names have been fetched (no read has, yet, when False)."""
        return self._table is not None

    def table(self) -> PathTable:
        """The names as one ``PathTable``, fetched on the first call."""
        if self._table is None:
            with self._lock:
                if self._table is None:
                    table = self._fetch()
                    if len(table) not in (0, self._records):
                        raise SnapshotError(
                            f"the pixpool daemon sent {len(table)} file names for the {self._records} records this "
                            "stream attached to; run the same pixpool release on both sides"
                        )
                    self._table = table
        return self._table

    def sizes(self) -> np.ndarray | None:
        """int64 (records, 2): each record's decoded (height, width) as the daemon's snapshot
        holds it (rect validation batches are planned from these), fetched with the names on the
        first call; None where the daemon keeps none."""
        if not self._sizes_asked and self._fetch_sizes is not None:
            with self._lock:
                if not self._sizes_asked:
                    table, sizes = self._fetch_sizes()
                    if sizes is not None and len(sizes) != self._records:
                        sizes = None
                    if self._table is None and len(table) in (0, self._records):
                        self._table = table
                    self._sizes, self._sizes_asked = sizes, True
        return self._sizes

    def __len__(self) -> int:
        return len(self.table())

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i):
        table = self.table()
        if isinstance(i, slice):
            start, stop, step = i.indices(len(table))
            return table.tolist(start, stop) if step == 1 else [table[k] for k in range(start, stop, step)]
        return table[i]

    def __iter__(self) -> Iterator[str]:
        return iter(self.table().tolist())

    def tolist(self) -> list[str]:
        return self.table().tolist()

    def __repr__(self) -> str:
        state = "fetched" if self.fetched else "not fetched yet"
        return f"RecordFiles({self._records} records, {state})"
