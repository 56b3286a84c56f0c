"""Publishing a file in a store: anonymous until complete, random names where not, debris swept.

Unit tests: no process is started; each store is a private folder (``tmp_path``).
"""

from __future__ import annotations

import errno
import itertools
import os
import stat

import pytest

from pixpool.shared.transport import holds, publish
from pixpool.shared.transport.names import parse, temporary_name
from pixpool.shared.transport.store import Store

NAME = "pixpool-u0-snap-00112233aabbccdd-lix0badcafe"


def _store(tmp_path) -> Store:
    path = tmp_path / "store"
    path.mkdir(mode=0o700)
    return Store.of(path)


def _published(store: Store) -> bytes:
    path = os.path.join(store, NAME)
    st = os.lstat(path)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    with open(path, "rb") as f:
        return f.read()


def test_publish_writes_and_replaces_with_nothing_else_left(tmp_path):
    store = _store(tmp_path)
    publish.publish_bytes(NAME, b"first", store)
    assert _published(store) == b"first"
    publish.publish_bytes(NAME, b"second, longer", store)  # over an existing file: a rename
    assert _published(store) == b"second, longer"
    assert os.listdir(store) == [NAME]


def _no_tmpfile(monkeypatch):
    real_open = os.open

    def fake_open(path, flags, *args, **kwargs):
        if flags & os.O_TMPFILE == os.O_TMPFILE:
            raise OSError(errno.EOPNOTSUPP, "Operation not supported", path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(publish.os, "open", fake_open)


def test_a_store_without_anonymous_files_gets_a_random_name_and_leaves_none(tmp_path, monkeypatch):
    store = _store(tmp_path)
    _no_tmpfile(monkeypatch)
    publish.publish_bytes(NAME, b"named", store)
    publish.publish_bytes(NAME, b"named again", store)
    assert _published(store) == b"named again" and os.listdir(store) == [NAME]


def test_a_kernel_that_cannot_link_an_anonymous_file_falls_back(tmp_path, monkeypatch):
    store = _store(tmp_path)

    def refuse(fd, path):
        raise OSError(errno.EXDEV, "Invalid cross-device link", path)

    monkeypatch.setattr(publish, "_link", refuse)
    publish.publish_bytes(NAME, b"fallback", store)
    assert _published(store) == b"fallback" and os.listdir(store) == [NAME]


@pytest.mark.parametrize("anonymous", [True, False])
def test_squatted_temporary_names_cost_nothing(tmp_path, monkeypatch, anonymous):
    """Whatever sits under the old predictable name, or under the first random names drawn,
    the writer takes the next and publishes."""
    store = _store(tmp_path)
    if not anonymous:
        _no_tmpfile(monkeypatch)
    squatted = [f"{NAME}.tmp{os.getpid()}", temporary_name(NAME), temporary_name(NAME)]
    for name in squatted:
        os.mkfifo(os.path.join(store, name), 0o644)
    publish.publish_bytes(NAME, b"placeholder", store)  # the final name exists: temporary names are used
    draws = itertools.chain(squatted[1:], iter(lambda: temporary_name(NAME), None))
    monkeypatch.setattr(publish, "temporary_name", lambda name: next(draws))
    publish.publish_bytes(NAME, b"published", store)
    assert _published(store) == b"published"
    assert sorted(os.listdir(store)) == sorted([NAME, *squatted])


def test_temporary_names_are_debris_to_parse_and_random():
    new = temporary_name(NAME)
    assert new != temporary_name(NAME) and new.startswith(NAME + ".tmp-")
    for name in (new, f"{NAME}.tmp1", "pixpool-u7-ring-1-00ff.tmp-abc"):
        parsed = parse(name)
        assert parsed is not None and parsed.kind == "debris" and parsed.group == name
    assert parse("pixpool-u7-ring-1-00ff.tmp-abc").uid == 7
    assert parse("pixpool-u0-nonsense.tmp1") is None and parse(".tmp1") is None


def test_sweep_removes_unheld_debris_of_ours_only(tmp_path):
    store = _store(tmp_path)
    me = os.geteuid()
    left = f"pixpool-u{me}-snap-00112233aabbccdd-lix0badcafe.tmp41"
    writing = temporary_name(f"pixpool-u{me}-snap-00112233aabbccdd-lix0badcafe")
    fifo = f"pixpool-u{me}-snap-00112233aabbccdd-lix0badcafe.tmp42"
    for name in (left, writing):
        with open(os.path.join(store, name), "wb") as f:
            f.write(b"x")
    os.mkfifo(os.path.join(store, fifo), 0o600)
    fd = os.open(os.path.join(store, writing), os.O_RDONLY)
    try:
        assert holds.hold(fd, (holds.CREATOR,))  # a live writer
        assert publish.sweep_debris(store) == [left]
    finally:
        os.close(fd)
    assert sorted(os.listdir(store)) == sorted([writing, fifo])  # a FIFO is no file of ours to remove
    assert publish.sweep_debris(store) == [writing]
