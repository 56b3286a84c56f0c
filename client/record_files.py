"""The image file of every record the daemon serves, fetched page by page after an attach.

Runs in the trainer process, on the Client's main socket, right after attach and before
any batch flows (``attach()`` names each batch's files from this list). The trainer asks for
the names ``packed``: each ``records`` reply then carries up to ``RECORDS_PAGE_BYTES`` of them
as one byte string (``shared/stream/path_table.py``), so 100k names take a few replies and
are kept as one buffer. A daemon of an earlier release ignores ``packed`` and answers with
lists of at most ``RECORDS_PAGE`` names; both come back as one ``PathTable``.
"""

from __future__ import annotations

from ..shared.stream.path_table import PathTable
from .connection import KEEP_WAITING, Connection, Peer


def fetch_files(conn: Connection, *, deadline: float, peer: Peer) -> PathTable:
    """Every record's image file name, in record order."""
    chunks: list[bytes] = []
    count = 0

    def page(msg: dict, frames: list):
        return msg if msg["start"] == count else KEEP_WAITING

    while True:
        conn.send("records", start=count, packed=True)
        msg = conn.wait({"records": page}, deadline=deadline, what="reply to records", peer=peer)
        if "packed" in msg:
            got = int(msg.get("count", 0))
            chunks.append(msg["packed"])
        else:
            got = len(msg["files"])
            chunks.append(PathTable.from_paths(msg["files"]).data)
        count += got
        if count >= msg["total"] or not got:
            return PathTable.from_packed(b"".join(chunks))
