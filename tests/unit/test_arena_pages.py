"""How the arena is written: the store's pages read from mountinfo, pwrite or the mapping."""

from __future__ import annotations

from pixpool.server.snapshot import arena_pages
from pixpool.server.snapshot.arena_pages import MAPPING, PWRITE, huge_page_store, mount_of, write_mode

MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
25 22 0:23 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=24683584k
30 22 0:30 / /mnt/huge rw,relatime - tmpfs tmpfs rw,size=8388608k,huge=always
31 22 0:31 / /mnt/within rw,relatime - tmpfs tmpfs rw,huge=within_size
32 22 0:32 / /mnt/advise rw,relatime - tmpfs tmpfs rw,huge=advise
33 30 0:33 / /mnt/huge/plain rw,relatime - tmpfs tmpfs rw,size=1024k
34 22 0:34 / /mnt/with\\040space rw,relatime - tmpfs tmpfs rw,huge=always
"""
NOT_FORCED = "always within_size advise [never] deny force"


def test_the_innermost_mount_holding_a_path_is_found():
    assert mount_of(MOUNTINFO, "/dev/shm") == ("/dev/shm", "tmpfs", "rw,size=24683584k")
    assert mount_of(MOUNTINFO, "/mnt/huge/store")[0] == "/mnt/huge"
    assert mount_of(MOUNTINFO, "/mnt/huge/plain/store")[0] == "/mnt/huge/plain"
    assert mount_of(MOUNTINFO, "/mnt/hugeish")[0] == "/"  # a prefix of the name is not a parent folder
    assert mount_of(MOUNTINFO, "/mnt/with space/x")[0] == "/mnt/with space"


def test_only_a_tmpfs_mounted_with_huge_pages_counts_as_huge():
    def huge(path: str, enabled: str = NOT_FORCED) -> bool:
        return huge_page_store(path, mountinfo=MOUNTINFO, shmem_enabled=enabled)

    assert huge("/mnt/huge") and huge("/mnt/within") and huge("/mnt/with space")
    assert not huge("/dev/shm")
    assert not huge("/mnt/advise")  # pages only where a mapping asks, and pwrite never does
    assert not huge("/mnt/huge/plain")
    assert not huge("/home/me/store")  # a disk
    # The kernel may force huge pages on every tmpfs, never on a disk.
    forced = "always within_size advise never deny [force]"
    assert huge("/dev/shm", forced) and not huge("/home/me/store", forced)


def test_the_write_mode_is_pwrite_unless_the_store_has_huge_pages_and_populate_works(monkeypatch):
    monkeypatch.setattr(arena_pages, "huge_page_store", lambda store: False)
    assert write_mode("/dev/shm") == PWRITE
    monkeypatch.setattr(arena_pages, "huge_page_store", lambda store: True)
    monkeypatch.setattr(arena_pages, "populate_supported", lambda: False)
    assert write_mode("/dev/shm") == PWRITE  # a kernel before 5.14: a full store would SIGBUS
    monkeypatch.setattr(arena_pages, "populate_supported", lambda: True)
    assert write_mode("/dev/shm") == MAPPING
