"""Which file systems and devices hold the bytes of a path: the mount table, overlay layers, loop devices.

Runs in the process that names or re-attaches a snapshot (the daemon at start-up, ``pixpool
prepare``), on behalf of ``fs_trust.identify``: a path's own ``statfs`` names the file system
the path shows (an overlay, a bind mount of a folder), not the one that holds its bytes. Where
those differ, a stat seen through the path can repeat for two versions of a file: an overlay
whose lower layer is a squashfs image swapped for another shows every stat of the old one;
an ext4 image on a loop device, swapped underneath with its bytes changed behind the file
system, keeps every inode, time and ``f_fsid``.

``holder_distrust`` follows the path to what holds it, in ``/proc/self/mountinfo``:

- an overlay: every layer (``lowerdir``, ``lowerdir+``, ``datadir+``, ``upperdir``), each judged in
  turn as a path of its own. Which layer holds a given file (copied up or not, metacopy) is not
  worked out: an overlay vouches only where all of its layers do.
- a bind mount: its entry already names the source's file system type and device.
- a block device: a loop device (or a partition of one, or a device-mapper/md device built on
  one, through ``slaves/``) holds an image file that can be swapped, so stat does not vouch.

It answers "" where every holder is on ``ALLOWED_TYPES`` and mounted read-write, else why not
(the reason names the layer or device): the caller hashes. Anything it cannot see (a layer path
that is relative or absent in this mount namespace, a mount point with another mount stacked on
it, no ``/sys/dev/block``) is a reason too. Parsing (``parse_mountinfo``, ``overlay_layers``,
``mount_of``) is pure; ``holder_distrust`` and ``_device_distrust`` read the files.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

# Mount types (mountinfo's names) whose kernel keeps a file's times and inode and moves the
# ctime on every write: the only ones whose stat vouches for content. Anything else (image file
# systems, FUSE, network file systems that answer from an attribute cache or a server we cannot
# judge, FAT, types not known here) is hashed: an allow-list, so an unknown type is never trusted.
ALLOWED_TYPES = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "tmpfs", "overlay"})
_MAX_DEPTH = 8  # an overlay over overlays, or device-mapper over partitions, deeper than this is not followed
_OCTAL = re.compile(r"\\([0-7]{3})")
_UNESCAPED_COLON = re.compile(r"(?<!\\):")


@dataclass(frozen=True)
class Mount:
    """One line of ``/proc/self/mountinfo`` (proc(5))."""

    mount_id: int
    parent_id: int
    major: int
    minor: int
    root: str  # the folder of the file system this mount shows (a bind mount: not "/")
    point: str
    options: tuple[str, ...]  # per-mount: ro/rw, nosuid ...
    fstype: str
    source: str
    super_options: tuple[str, ...]  # per file system: an overlay's layers

    @property
    def readonly(self) -> bool:
        return "ro" in self.options or "ro" in self.super_options


def _unescape(text: str) -> str:
    # The kernel writes space, tab, newline, backslash (and in options ',' ':' '=') as \ooo.
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), text)


def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts of a ``/proc/<pid>/mountinfo`` text, in its order; lines that do not parse are skipped."""
    out = []
    for line in text.splitlines():
        fields = line.split(" ")
        try:
            sep = fields.index("-", 6)
            major, minor = fields[2].split(":")
            out.append(
                Mount(
                    mount_id=int(fields[0]), parent_id=int(fields[1]), major=int(major), minor=int(minor),
                    root=_unescape(fields[3]), point=_unescape(fields[4]), options=tuple(fields[5].split(",")),
                    fstype=fields[sep + 1], source=_unescape(fields[sep + 2]),
                    super_options=tuple(fields[sep + 3].split(",")) if len(fields) > sep + 3 else (),
                )
            )  # fmt: skip
        except (ValueError, IndexError):
            continue
    return out


def overlay_layers(super_options: tuple[str, ...]) -> list[str]:
    """Every layer folder an overlay's options name (lower ones, data-only ones, the upper one),
    unescaped; ``workdir`` holds no file a reader sees."""
    layers = []
    for opt in super_options:
        key, _, value = opt.partition("=")
        if key == "lowerdir":
            # Layers are separated by ':' ('::' before data-only layers); a ':' inside a name is
            # written \072 (kernels from 6.5) or \: (older ones, the name as the user gave it).
            layers += [_unescape(p).replace("\\:", ":") for p in _UNESCAPED_COLON.split(value) if p]
        elif key in ("lowerdir+", "datadir+", "upperdir"):
            layers.append(_unescape(value))
    return layers


def _under(path: str, point: str) -> bool:
    return point == "/" or path == point or path.startswith(point + "/")


def mount_of(mounts: list[Mount], path: str) -> tuple[Mount | None, bool]:
    """(the mount an absolute, resolved ``path`` lives on, whether another mount sits at the same
    point under it). The deepest mount point above the path; of several at one point, the one
    mounted over the others (no other one there names it as its parent)."""
    best = [m for m in mounts if _under(path, m.point)]
    if not best:
        return None, False
    depth = max(len(m.point) for m in best)
    here = [m for m in best if len(m.point) == depth]
    parents = {m.parent_id for m in here}
    top = [m for m in here if m.mount_id not in parents] or here
    return top[-1], len(here) > 1


def read_mounts(path: str = "/proc/self/mountinfo") -> list[Mount]:
    with open(path) as f:
        return parse_mountinfo(f.read())


def holder_distrust(
    path: str, *, mounts: list[Mount], shown_type: str | None = None, sys_root: str = "/sys", _depth: int = 0
) -> str:
    """ "" where every file system and device holding ``path``'s bytes is on ``ALLOWED_TYPES``, mounted
    read-write and on no loop device; else why not (module docstring). ``shown_type``: the type
    ``statfs`` gives for ``path`` (ext2 and ext3 named ext4, as they share one magic); a mount
    table that shows another type, or another device, is not this path's (another mount
    namespace's table, a mount changed between the two reads): a reason too."""
    if _depth > _MAX_DEPTH:
        return f"{path}: layers nested deeper than {_MAX_DEPTH}"
    if not os.path.isabs(path):
        return f"overlay layer {path!r} is a relative path: cannot tell which file system holds it"
    try:
        real = os.path.realpath(path, strict=True)
    except OSError:
        return f"{path} is not in this mount namespace: cannot tell which file system holds it"
    mount, stacked = mount_of(mounts, real)
    if mount is None:
        return f"no mount of {real} in /proc/self/mountinfo"
    if stacked and _depth:
        return f"{mount.point} has mounts stacked on it: cannot tell which one the overlay holds"
    if shown_type is not None:
        why = _shown_mismatch(real, mount, shown_type)
        if why:
            return why
    if mount.fstype not in ALLOWED_TYPES:
        return f"{real} is held by {mount.fstype} ({mount.source}), whose stat does not move with content"
    if mount.readonly:
        return f"{real} is held by a read-only {mount.fstype} mount at {mount.point}"
    if mount.fstype == "overlay":
        layers = overlay_layers(mount.super_options)
        if not layers:
            return f"the overlay at {mount.point} names no layers in its options"
        for layer in layers:
            why = holder_distrust(layer, mounts=mounts, sys_root=sys_root, _depth=_depth + 1)
            if why:
                return f"overlay layer {layer} of {mount.point}: {why}"
        return ""
    return _device_distrust(mount, sys_root=sys_root)


def _shown_mismatch(real: str, mount: Mount, shown_type: str) -> str:
    table_type = "ext4" if mount.fstype in ("ext2", "ext3") else mount.fstype
    if table_type != shown_type:
        return f"the mount table shows {mount.fstype} at {mount.point} where statfs of {real} shows {shown_type}"
    # An overlay's files show a per-layer device, btrfs a per-subvolume one: only others are compared.
    if mount.fstype not in ("overlay", "btrfs"):
        try:
            dev = os.stat(real).st_dev
        except OSError as exc:
            return f"cannot stat {real} ({exc})"
        if dev != os.makedev(mount.major, mount.minor):
            return (f"the mount table shows device {mount.major}:{mount.minor} at {mount.point} where {real} is on "
                    f"{os.major(dev)}:{os.minor(dev)}")  # fmt: skip
    return ""


def _device_distrust(mount: Mount, *, sys_root: str) -> str:
    if mount.fstype == "tmpfs":
        return ""  # memory: no device to swap
    major, minor = mount.major, mount.minor
    if major == 0:  # btrfs shows an anonymous device number: its device is the mount's source
        try:
            st = os.stat(mount.source)
        except OSError:
            return f"cannot tell which device holds the {mount.fstype} at {mount.point} ({mount.source} not found)"
        if not (st.st_mode & 0o170000 == 0o060000):  # S_ISBLK
            return f"{mount.source} under {mount.point} is no block device"
        major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
    return _block_distrust(major, minor, sys_root=sys_root, depth=0)


def _block_distrust(major: int, minor: int, *, sys_root: str, depth: int) -> str:
    node = os.path.join(sys_root, "dev", "block", f"{major}:{minor}")
    try:
        real = os.path.realpath(node, strict=True)
    except OSError:
        return f"cannot tell what block device {major}:{minor} is ({node} not found)"
    if depth > _MAX_DEPTH:
        return f"block device {major}:{minor} is stacked deeper than {_MAX_DEPTH}"
    # A partition's own folder has no loop/ or slaves/: its disk's folder (the parent) does.
    disk = os.path.dirname(real) if os.path.exists(os.path.join(real, "partition")) else real
    loop = os.path.join(disk, "loop")
    if os.path.isdir(loop):
        try:
            with open(os.path.join(loop, "backing_file")) as f:
                backing = f.read().strip()
        except OSError:
            backing = "an image file"
        return (f"on loop device {os.path.basename(disk)}, backed by {backing}: an image swapped underneath keeps "
                "every stat")  # fmt: skip
    try:
        slaves = sorted(os.listdir(os.path.join(disk, "slaves")))
    except OSError:
        slaves = []
    for name in slaves:  # device-mapper, md: judged by the devices they are built on
        try:
            with open(os.path.join(disk, "slaves", name, "dev")) as f:
                smaj, smin = (int(v) for v in f.read().split(":"))
        except (OSError, ValueError):
            return f"cannot tell what {name} under block device {major}:{minor} is"
        why = _block_distrust(smaj, smin, sys_root=sys_root, depth=depth + 1)
        if why:
            return why
    return ""
