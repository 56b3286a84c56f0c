"""The accountant: pure /proc parsers on fixed text, and live figures from this process."""

from __future__ import annotations

import os

import numpy as np

from pixpool.ops import accounting as accountant
from pixpool.shared import text
from pixpool.shared.transport import procmem
from pixpool.shared.transport.shm import SharedSegment, unlink_segment

SMAPS = """\
7f0000000000-7f0000100000 r--s 00000000 00:1a 123                        /dev/shm/pixpool-snap-0123456789abcdef-img
Size:               1024 kB
Rss:                 512 kB
Pss:                 256 kB
Shared_Clean:        512 kB
Private_Clean:         0 kB
VmFlags: rd sh mr mw me ms sd
7f0000100000-7f0000200000 r--s 00100000 00:1a 123                        /dev/shm/pixpool-snap-0123456789abcdef-img
Size:               1024 kB
Rss:                   8 kB
Pss:                   4 kB
55d000000000-55d000001000 rw-p 00000000 00:00 0
Rss:                 100 kB
7f0000300000-7f0000301000 rw-s 00000000 00:1a 456                        /dev/shm/pixpool-ring-99-1 (deleted)
Rss:                   4 kB
Pss:                   4 kB
7f0000400000-7f0000401000 r-xp 00000000 08:01 789                        /usr/lib/libc.so.6
Rss:                  40 kB
Pss:                   2 kB
"""


def test_parse_smaps_sums_per_path_and_skips_anonymous():
    parsed = procmem.parse_smaps(SMAPS)
    img = "/dev/shm/pixpool-snap-0123456789abcdef-img"
    assert parsed[img]["Rss"] == (512 + 8) * 1024
    assert parsed[img]["Pss"] == (256 + 4) * 1024
    assert parsed[img]["Size"] == 2048 * 1024
    assert "/dev/shm/pixpool-ring-99-1" in parsed  # " (deleted)" stripped
    assert None not in parsed and all(p for p in parsed)
    seg = procmem.pixpool_resident(parsed)
    assert set(seg) == {"pixpool-snap-0123456789abcdef-img", "pixpool-ring-99-1"}
    assert seg["pixpool-snap-0123456789abcdef-img"] == {"rss": 520 * 1024, "pss": 260 * 1024}


def test_parse_maps_line():
    assert procmem.parse_maps_line("55d0-55d1 rw-p 00000000 00:00 0 ") is None
    assert procmem.parse_maps_line("7f-80 r--s 0 00:1a 1   /dev/shm/pixpool-x (deleted)\n") == "/dev/shm/pixpool-x"


def test_live_process_sees_its_own_mapping_and_residency(shm_name):
    name = shm_name()
    nbytes = 4 << 20
    seg = SharedSegment.create(name, nbytes)
    try:
        arr = np.frombuffer(seg.buf, dtype=np.uint8)
        arr[::4096] = 1  # touch every page
        users = procmem.segment_users()
        assert os.getpid() in users.get(name, set())
        (me,) = procmem.process_memory([os.getpid()])
        assert me.rss > 0 and me.uss > 0 and me.pss > 0
        assert me.segments[name]["rss"] == nbytes  # every page resident, measured by the kernel
        text = accountant.format_process_report([me])
        assert str(os.getpid()) in text and "pss" in text
        del arr
    finally:
        seg.close()
        unlink_segment(name)
    assert name not in procmem.segment_users()


def test_format_table_aligns():
    out = text.format_table([["a", 1], ["bbb", 22]], ["name", "n"])
    lines = out.splitlines()
    assert lines[0].startswith("name") and set(lines[1]) <= {"-", " "}
    assert lines[2].endswith(" 1") and lines[3].endswith("22")
