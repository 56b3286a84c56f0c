"""Another local user must not be able to read, poison or block a trainer's data.

Each attack runs as a second Unix user (``other_user``: made with useradd when the tests
run as root, skipped otherwise) against /dev/shm, the one directory every user shares.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

from helpers.snapshot import remove_snapshot
from helpers.users import as_user, cli_as
from pixpool.cli import main
from pixpool.server.readers import load_dataset
from pixpool.server.snapshot.fingerprint import base_name, fingerprint
from pixpool.server.snapshot.handle import Snapshot
from pixpool.server.snapshot.prepare import PrepareOptions, prepare_snapshot
from pixpool.shared.errors import CapacityError, ConfigError, UntrustedSegmentError
from pixpool.shared.transport.names import snapshot_base, snapshot_parts
from pixpool.shared.transport.store import DEFAULT, Store

IMGSZ = 64


def _write_world_writable(files: dict[str, bytes], mode: int) -> None:
    for name, data in files.items():
        fd = os.open(DEFAULT.path(name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        os.fchmod(fd, mode)  # past the umask: the attacker wants it exactly so
        os.write(fd, data)
        os.close(fd)


def _unlink_all(names) -> None:
    for n in names:
        try:
            os.unlink(DEFAULT.path(n))
        except FileNotFoundError:
            pass


def _poisoned_copy(dataset) -> dict[str, bytes]:
    """The bytes of this dataset's real snapshot with its pixels changed, keyed by the
    victim's segment names; the real snapshot is gone again afterwards."""
    result = prepare_snapshot(dataset, PrepareOptions(imgsz=IMGSZ, processes=1))
    snap = result.snapshot
    dtype = np.dtype(snap.dtype)
    files = {}
    for name in snap.segment_names:
        with open(DEFAULT.path(name), "rb") as f:
            files[name] = f.read()
    snap.close()
    remove_snapshot(snap.name)
    img = next(n for n in files if n.endswith("-img"))
    files[img] = np.full(len(files[img]) // dtype.itemsize, 99, dtype).tobytes()  # every pixel rewritten
    return files


@pytest.mark.parametrize("mode", [0o666, 0o644])
def test_snapshot_planted_by_another_user_is_never_mapped_and_costs_only_a_fresh_name(
    other_user, synthetic_data, mode, capsys, caplog
):
    """Planted complete snapshot under the victim's name: world-writable or not, it is
    another user's, so it is never mapped: an attach by that name refuses naming the file, its
    owner and mode, and a preparation takes the next name and decodes its own, saying whose
    file it passed over. The planted files stay (not ours to remove)."""
    dataset = load_dataset(synthetic_data.coco_json)
    first = base_name(fingerprint(dataset, imgsz=IMGSZ))
    files = _poisoned_copy(dataset)
    as_user(other_user, _write_world_writable, files, mode)
    taken = None
    try:
        with pytest.raises(UntrustedSegmentError) as err:
            Snapshot.attach(first)
        text = str(err.value)
        assert "/dev/shm/" + first in text
        assert f"uid {other_user.uid} ({other_user.name})" in text and f"mode {mode:04o}" in text and "remove" in text
        result = prepare_snapshot(dataset, PrepareOptions(imgsz=IMGSZ, processes=1))
        snap = result.snapshot
        taken = snap.name
        assert taken != first and not result.reused
        assert not np.all(np.asarray(snap.image(0)) == 99.0)  # its own pixels, not the planted ones
        snap.close()
        assert "/dev/shm/" + first in caplog.text and f"uid {other_user.uid} ({other_user.name})" in caplog.text
        # The CLI re-attaches it under that name and exits 0; the planted files stay.
        assert main(["prepare", str(synthetic_data.coco_json), "--imgsz", str(IMGSZ), "--processes", "1"]) == 0
        assert taken in capsys.readouterr().out
        assert all(os.lstat(DEFAULT.path(n)).st_uid == other_user.uid for n in files)
    finally:
        if taken is not None:
            remove_snapshot(taken)
        _unlink_all(files)


def test_own_snapshot_made_world_writable_is_refused(store, synthetic_data):
    dataset = load_dataset(synthetic_data.coco_json)
    result = prepare_snapshot(dataset, PrepareOptions(imgsz=IMGSZ, processes=1, store=store))
    snap = result.snapshot
    snap.close()
    img = snapshot_parts(snap.name)["img"]
    try:
        os.chmod(Store.of(store).path(img), 0o666)
        hint = "pixpool clean" + ("" if store == "/dev/shm" else f" --store {store}")
        with pytest.raises(
            UntrustedSegmentError,
            match=rf"{re.escape(Store.of(store).path(img))} .*mode 0666: group or others may write it.*{re.escape(hint)}",
        ):
            prepare_snapshot(dataset, PrepareOptions(imgsz=IMGSZ, processes=1, store=store))
    finally:
        remove_snapshot(snap.name, store)


def test_a_store_others_could_write_or_own_is_refused(tmp_path, other_user, synthetic_data, capsys):
    """The store directory is checked before anything is made in it: not one others may
    write without the sticky bit, nor one another user owns; a missing one is named too."""
    dataset = load_dataset(synthetic_data.coco_json)
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    with pytest.raises(ConfigError, match=rf"store {re.escape(str(open_dir))} has mode 0777.*sticky"):
        prepare_snapshot(dataset, PrepareOptions(imgsz=IMGSZ, processes=1, store=str(open_dir)))
    os.chmod(open_dir, 0o1777)  # sticky, as /dev/shm: others cannot remove or rename our files
    result = prepare_snapshot(dataset, PrepareOptions(imgsz=IMGSZ, processes=1, store=str(open_dir)))
    result.snapshot.release()
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, other_user.uid, other_user.gid)
    with pytest.raises(ConfigError, match=f"belongs to uid {other_user.uid}"):
        prepare_snapshot(dataset, PrepareOptions(imgsz=IMGSZ, processes=1, store=str(theirs)))
    assert (
        main(["serve", str(synthetic_data.coco_json), "--imgsz", str(IMGSZ), "--store", str(tmp_path / "missing")]) == 1
    )
    assert f"store {tmp_path / 'missing'} does not exist" in capsys.readouterr().err
    assert os.listdir(open_dir) == [] and os.listdir(theirs) == []


def test_users_never_collide_on_a_name(other_user):
    key = "0123456789abcdef"
    assert snapshot_base(key) != snapshot_base(key, uid=other_user.uid)
    assert snapshot_base(key, uid=other_user.uid).startswith(f"pixpool-u{other_user.uid}-")


# -- ring squatting ---------------------------------------------------------------------------
def _create_empty(names) -> None:
    for n in names:
        os.close(os.open(DEFAULT.path(n), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))


def test_squatted_ring_names_are_skipped_and_use_up_no_trainer_id(other_user, monkeypatch):
    """A file pre-created under a ring name is never adopted: the daemon draws another
    unguessable name; an attach that fails uses up no trainer id."""
    from pixpool.server.daemon import sessions as sessions_mod
    from pixpool.server.daemon.scheduler import Scheduler
    from pixpool.shared.stream.config import StreamSettings
    from pixpool.shared.transport.ring import RingLayout

    pid = os.getpid()
    squatted = [sessions_mod.ring_segment(pid, t) for t in ("aa" * 8, "bb" * 8)]
    as_user(other_user, _create_empty, squatted)
    tokens = iter(["aa" * 8] * sessions_mod._RING_NAME_TRIES + ["aa" * 8, "bb" * 8, "cc" * 8])
    monkeypatch.setattr(sessions_mod, "new_ring_token", lambda: next(tokens))
    sessions = sessions_mod.Sessions(pid, Scheduler(), heartbeat_timeout_s=10.0, on_detach=lambda name: None)
    layout = RingLayout(slots=2, batch_size=2, imgsz=32, max_targets=4)
    msg = {"pid": pid, "host": "h", "delivery": "shm"}
    try:
        with pytest.raises(CapacityError, match="fresh random names"):  # every draw squatted
            sessions.attach(msg, StreamSettings(), layout, sock=None, identity=b"x")
        t = sessions.attach(msg, StreamSettings(), layout, sock=None, identity=b"x")
        assert t.trainer_id == 1, "the failed attach used up a trainer id"
        assert t.ring.name == sessions_mod.ring_segment(pid, "cc" * 8)
        assert os.stat(DEFAULT.path(t.ring.name)).st_uid == os.geteuid()
        assert all(os.lstat(DEFAULT.path(n)).st_uid == other_user.uid for n in squatted), (
            "someone else's file was touched"
        )
    finally:
        sessions.detach_all("test over")
        _unlink_all(squatted)


def test_ring_names_are_unguessable():
    from pixpool.shared.transport.names import new_ring_token, parse, ring_segment

    names = {ring_segment(1234, new_ring_token()) for _ in range(100)}
    assert len(names) == 100
    assert all(len(parse(n).token) == 16 for n in names)


# -- ls and clean on a shared machine ----------------------------------------------------------
def _plant_own(names) -> None:
    for n in names:
        os.close(os.open(DEFAULT.path(n), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def test_ls_and_clean_act_on_the_callers_own_segments_only(other_user, synthetic_data, capsys):
    dataset = load_dataset(synthetic_data.coco_json)
    result = prepare_snapshot(dataset, PrepareOptions(imgsz=IMGSZ, processes=1))
    mine = result.snapshot
    mine.close()
    theirs = list(snapshot_parts(snapshot_base("feedfacefeedface", uid=other_user.uid)).values())
    as_user(other_user, _plant_own, theirs)
    try:
        # The other user lists and cleans: no PermissionError, a note about root's segments,
        # and root's snapshot survives its clean.
        code, _, err = cli_as(other_user, ["ls"])
        assert code == 0, err
        # (root's count includes whatever else runs on this machine: at least our 3)
        assert re.search(r"skipped \d+ segment\(s\) of other users \(uid 0: \d+\)", err), err
        code, out, err = cli_as(other_user, ["clean", "--all"])
        assert code == 0, err
        assert all(os.path.exists(DEFAULT.path(n)) for n in mine.segment_names), out
        assert all(f"removed {n}" in out for n in theirs), out
        assert "segment(s) of other users (uid 0:" in out
        # Root cleans: the other user's files are never removed, only noted.
        as_user(other_user, _plant_own, theirs)
        # (named: a bare clean as root would also sweep other runs' unused segments here)
        assert main(["clean", "--all", *theirs, mine.name]) == 0
        out = capsys.readouterr().out
        assert all(os.path.exists(DEFAULT.path(n)) for n in theirs)
        assert f"uid {other_user.uid}: 3)" in out and f"removed {mine.segment_names[0]}" in out
        result = prepare_snapshot(dataset, PrepareOptions(imgsz=IMGSZ, processes=1))
        mine = result.snapshot
        mine.close()
        assert main(["ls", "--json"]) == 0
        captured = capsys.readouterr()
        assert theirs[0].rpartition("-")[0] not in captured.out and mine.name in captured.out
    finally:
        remove_snapshot(mine.name)
        _unlink_all(theirs)
