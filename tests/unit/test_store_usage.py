"""Pure parts of the store accounting and of the snapshot's spare names (no processes, no files)."""

from __future__ import annotations

from pixpool.server.snapshot.fingerprint import NAME_CANDIDATES, base_name, candidate_bases
from pixpool.server.snapshot.store_usage import parse_shm_maps
from pixpool.shared.transport.names import parse, snapshot_parts

MAPS = """\
7f00a000-7f00b000 rw-s 00000000 00:1a 1234                       /dev/shm/sem.mp-abc123
7f00b000-7f00c000 rw-s 00000000 00:1a 1234                       /dev/shm/sem.mp-abc123
7f00c000-7f00d000 rw-s 00000000 00:1a 1240                       /dev/shm/pym-4242-xyz (deleted)
7f00d000-7f00e000 rw-s 00000000 00:1a 1250                       /dev/shm/pixpool-u0-snap-00112233aabbccdd-meta
7f00e000-7f00f000 r--p 00000000 08:01 99                         /usr/lib/libc.so.6
7f00f000-7f010000 rw-p 00000000 00:00 0
"""


def test_own_semaphores_and_heap_files_are_read_from_the_maps_once_each():
    assert parse_shm_maps(MAPS) == {1234: "/dev/shm/sem.mp-abc123", 1240: "/dev/shm/pym-4242-xyz"}


def test_every_spare_name_is_a_snapshot_name_of_its_own_group_led_by_the_first():
    fp = "0123456789abcdef" * 2
    bases = candidate_bases(fp)
    assert bases[0] == base_name(fp) and len(set(bases)) == len(bases) == NAME_CANDIDATES
    for base in bases:
        meta = snapshot_parts(base)["meta"]
        parsed = parse(meta)
        assert parsed.kind == "snapshot" and parsed.group == base and fp.startswith(base.rsplit("-", 1)[1])
