"""mounts' parsing of /proc/self/mountinfo: which mount a path is on, an overlay's layers, and the
judgement on a mount table and a fake /sys. No mounts are made (tests/integration/test_fs_trust_matrix.py
makes real ones)."""

from __future__ import annotations

import os

from pixpool.server.snapshot import mounts

TABLE = "\n".join(
    [
        "22 27 0:21 / /proc rw,relatime - proc proc rw",
        "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard",
        "25 24 0:23 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=24683784k",
        "30 25 0:27 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=1k",  # stacked over 25
        "110 27 7:0 / /srv/lower ro,relatime - squashfs /dev/loop0 ro,errors=continue",
        "114 27 0:42 / /srv/my\\040data rw,relatime - overlay overlay rw,lowerdir=/srv/lower:/srv/a\\072b,"
        "upperdir=/srv/up,workdir=/srv/work,uuid=on",
        "120 27 7:1 /sub /data rw,relatime shared:5 master:1 - ext4 /dev/loop1 rw",  # a bind mount, optional fields
        "not a mountinfo line",
    ]
)


def test_parse_mountinfo():
    table = mounts.parse_mountinfo(TABLE)
    assert len(table) == 7
    overlay = next(m for m in table if m.fstype == "overlay")
    assert overlay.point == "/srv/my data" and (overlay.major, overlay.minor) == (0, 42)
    bind = table[-1]
    assert (bind.root, bind.point, bind.fstype, bind.source, bind.major, bind.minor) == (
        "/sub", "/data", "ext4", "/dev/loop1", 7, 1)  # fmt: skip
    squash = next(m for m in table if m.fstype == "squashfs")
    assert squash.readonly and not bind.readonly


def test_overlay_layers_unescape_names_and_skip_the_workdir():
    table = mounts.parse_mountinfo(TABLE)
    overlay = next(m for m in table if m.fstype == "overlay")
    assert mounts.overlay_layers(overlay.super_options) == ["/srv/lower", "/srv/a:b", "/srv/up"]
    # Older kernels show the names as given: ':' inside one written '\:'; '::' before data-only layers.
    assert mounts.overlay_layers(("lowerdir=/a\\:1:/b::/c", "upperdir=/u")) == ["/a:1", "/b", "/c", "/u"]
    assert mounts.overlay_layers(("lowerdir+=/a", "lowerdir+=/b", "datadir+=/d")) == ["/a", "/b", "/d"]


def test_mount_of_takes_the_deepest_point_and_the_mount_on_top():
    table = mounts.parse_mountinfo(TABLE)
    m, stacked = mounts.mount_of(table, "/dev/shm/x")
    assert m.mount_id == 30 and stacked
    m, stacked = mounts.mount_of(table, "/srv/lower/images/a.jpg")
    assert m.fstype == "squashfs" and not stacked
    assert mounts.mount_of(table, "/srv/lowerx")[0].fstype == "ext4"  # a name that only starts alike
    assert mounts.mount_of(table, "/data")[0].mount_id == 120


def _fake_sys(root, name: str, major: int, minor: int, *, loop_of: str | None = None, slaves=()):
    """/sys/dev/block/M:m -> /sys/devices/NAME with loop/backing_file or slaves/, as the kernel lays it out."""
    dev = root / "devices" / name
    dev.mkdir(parents=True)
    (dev / "dev").write_text(f"{major}:{minor}\n")
    if loop_of is not None:
        (dev / "loop").mkdir()
        (dev / "loop" / "backing_file").write_text(loop_of + "\n")
    (dev / "slaves").mkdir()
    for slave in slaves:
        os.symlink(root / "devices" / slave, dev / "slaves" / slave)
    (root / "dev" / "block").mkdir(parents=True, exist_ok=True)
    os.symlink(dev, root / "dev" / "block" / f"{major}:{minor}")


def test_holder_distrust_follows_overlay_layers_and_loop_devices(tmp_path):
    sys_root = tmp_path / "sys"
    _fake_sys(sys_root, "vda", 254, 0)
    _fake_sys(sys_root, "loop3", 7, 3, loop_of="/images/v1.img")
    _fake_sys(sys_root, "dm-0", 253, 0, slaves=["loop3"])
    work = tmp_path / "w"
    for d in ("ext", "loopext", "dm", "sq", "up", "ov", "ov2"):
        (work / d).mkdir(parents=True)
    w = str(work)
    table = mounts.parse_mountinfo(
        "\n".join(
            [
                "1 0 254:0 / / rw - ext4 /dev/vda rw",
                f"2 1 7:3 / {w}/loopext rw - ext4 /dev/loop3 rw",
                f"3 1 253:0 / {w}/dm rw - xfs /dev/mapper/x rw",
                f"4 1 7:4 / {w}/sq ro - squashfs /dev/loop4 ro",
                f"5 1 0:40 / {w}/ov rw - overlay overlay rw,lowerdir={w}/sq,upperdir={w}/up,workdir={w}/w",
                f"6 1 0:41 / {w}/ov2 rw - overlay overlay rw,lowerdir={w}/ext,upperdir={w}/up,workdir={w}/w",
            ]
        )
    )

    def why(path: str) -> str:
        return mounts.holder_distrust(str(work / path), mounts=table, sys_root=str(sys_root))

    assert why("ext") == ""  # ext4 on a disk
    assert "loop3" in why("loopext") and "/images/v1.img" in why("loopext")
    assert "loop3" in why("dm")  # device-mapper built on a loop device
    assert "squashfs" in why("ov") and "overlay layer" in why("ov")
    assert why("ov2") == ""  # every layer on a disk's ext4
    # A layer that is not in this mount namespace, or named by a relative path, is not judged: distrusted.
    gone = mounts.parse_mountinfo(f"1 0 254:0 / / rw - ext4 /dev/vda rw\n5 1 0:40 / {w}/ov rw - overlay o "
                                  f"rw,lowerdir=/nowhere/layer,upperdir=rel/up")  # fmt: skip
    assert "not in this mount namespace" in mounts.holder_distrust(str(work / "ov"), mounts=gone,
                                                                   sys_root=str(sys_root))  # fmt: skip
    # No /sys to tell what a block device is: distrusted.
    assert "cannot tell" in mounts.holder_distrust(str(work / "ext"), mounts=table, sys_root=str(tmp_path / "none"))
