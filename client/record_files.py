"""The image file of every record the daemon serves, fetched page by page after an attach.

Runs in the trainer process, on the Client's main socket, right after attach and before
any batch flows (``attach()`` names each batch's files from this list). A ``records`` reply
carries at most ``RECORDS_PAGE`` names (``shared/stream/protocol.py``), so the list comes
in pages, each asked for by the position it starts at.
"""

from __future__ import annotations

from .connection import KEEP_WAITING, Connection, Peer


def fetch_files(conn: Connection, *, deadline: float, peer: Peer) -> list[str]:
    """Every record's image file name, in record order."""
    files: list[str] = []

    def page(msg: dict, frames: list):
        return msg if msg["start"] == len(files) else KEEP_WAITING

    while True:
        conn.send("records", start=len(files))
        msg = conn.wait({"records": page}, deadline=deadline, what="reply to records", peer=peer)
        files.extend(msg["files"])
        if len(files) >= msg["total"] or not msg["files"]:
            return files
