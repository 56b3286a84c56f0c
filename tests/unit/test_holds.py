"""The one rule for "in use" (``shared.transport.holds``), on segments of this process.

Unit tests: no process is started. OFD locks belong to open file descriptions, not to
processes, so a second ``open`` in this very process is another holder, exactly as a
process in another container would be; the remover racing an attacher is played by a
thread, and the unlink between an attacher's open and its lock is put there by
monkeypatching the lock step. Every segment is removed after the test (``shm_name``).
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from pixpool.shared.transport import holds
from pixpool.shared.transport.names import ring_segment
from pixpool.shared.transport.ring import Ring, RingLayout
from pixpool.shared.transport.shm import SharedSegment
from pixpool.shared.transport.store import DEFAULT


def _held(name: str) -> holds.Holds:
    got = holds.holds_of(name)
    assert got is not None, f"{name} is gone"
    return got


def test_a_mapping_holds_its_segment_until_it_goes(shm_name):
    name = shm_name("held")
    seg = SharedSegment.create(name, 4096)
    assert _held(name) == holds.Holds(in_use=True, creator=True, consumer=False)
    reader = SharedSegment.attach(name, consumer=True)
    seg.close()
    assert _held(name) == holds.Holds(in_use=True, creator=False, consumer=True)
    reader.close()
    assert _held(name) == holds.Holds(in_use=False, creator=False, consumer=False)
    assert holds.holds_of(name + "-none") is None


def test_a_view_keeps_the_hold_after_close_unless_let_go(shm_name):
    name = shm_name("view")
    SharedSegment.create(name, 4096).close()
    seg = SharedSegment.attach(name)
    view = np.frombuffer(seg.buf, np.uint8)
    seg.close()  # deferred: the view still maps the file
    assert _held(name).in_use
    assert holds.remove_unused([name]) == "in use"
    del view
    assert not _held(name).in_use
    seg = SharedSegment.attach(name)
    view = np.frombuffer(seg.buf, np.uint8)
    seg.close(let_go=True)  # leaving: the view stays valid, the hold goes
    assert not _held(name).in_use and int(view[0]) == 0
    assert holds.remove_unused([name]) == "removed" and not os.path.exists(DEFAULT.path(name))
    assert int(view[0]) == 0  # an unlinked file's pages live on while mapped


def test_the_remover_is_refused_while_a_reader_holds_it(shm_name):
    name = shm_name("remove")
    SharedSegment.create(name, 4096).close()
    reader = SharedSegment.attach(name)
    assert holds.remove_unused([name]) == "in use"
    assert os.path.exists(DEFAULT.path(name)) and reader.buf[0] == 0
    reader.close()
    assert holds.remove_unused([name]) == "removed"
    assert not os.path.exists(DEFAULT.path(name))
    assert holds.remove_unused([name]) == "gone"


def test_a_group_goes_whole_or_not_at_all(shm_name):
    names = [shm_name(part) for part in ("meta", "img", "tgt")]
    for n in names:
        SharedSegment.create(n, 4096).close()
    last = SharedSegment.attach(names[2])  # only the last part is held
    assert holds.remove_unused(names) == "in use"
    assert all(os.path.exists(DEFAULT.path(n)) for n in names)
    # The remover let go of the parts it had locked: they attach again at once.
    SharedSegment.attach(names[0]).close()
    last.close()
    assert holds.remove_unused(names) == "removed"
    assert not any(os.path.exists(DEFAULT.path(n)) for n in names)


def test_an_attach_racing_an_unlink_ends_in_file_not_found(shm_name, monkeypatch):
    name = shm_name("race")
    SharedSegment.create(name, 4096).close()
    real = holds.hold_waiting

    def unlinked_first(fd, roles=(holds.MAPPED,), **kw):
        os.unlink(DEFAULT.path(name))  # a remover's unlink lands between the attacher's open and its lock
        return real(fd, roles, **kw)

    monkeypatch.setattr(holds, "hold_waiting", unlinked_first)
    with pytest.raises(FileNotFoundError, match="removed while being attached"):
        SharedSegment.attach(name)
    # Replaced by another file under the same name: no mapping of the one it opened either.
    SharedSegment.create(name, 4096).close()

    def replaced_first(fd, roles=(holds.MAPPED,), **kw):
        os.unlink(DEFAULT.path(name))
        SharedSegment.create(name, 8192).close()
        return real(fd, roles, **kw)

    monkeypatch.setattr(holds, "hold_waiting", replaced_first)
    with pytest.raises(FileNotFoundError):
        SharedSegment.attach(name)


def test_an_attach_meeting_a_remover_waits_for_its_outcome(shm_name):
    name = shm_name("busy")
    SharedSegment.create(name, 4096).close()
    path = DEFAULT.path(name)
    for unlinks in (True, False):
        fd = os.open(path, os.O_RDWR)
        assert holds._setlk(fd, holds.fcntl.F_WRLCK, 0, 0)  # a remover holds its write lock
        waiting = threading.Event()
        result: list = []

        def attach(waiting=waiting, result=result):  # this iteration's, bound now
            waiting.set()
            try:
                result.append(SharedSegment.attach(name))
            except FileNotFoundError as exc:
                result.append(exc)

        t = threading.Thread(target=attach)
        t.start()
        assert waiting.wait(5)
        if unlinks:
            os.unlink(path)  # it removes the file...
        os.close(fd)  # ...and lets go; or it gives up (a group with a part in use)
        t.join(10)
        assert not t.is_alive() and len(result) == 1
        if unlinks:
            assert isinstance(result[0], FileNotFoundError)
            SharedSegment.create(name, 4096).close()
        else:
            assert isinstance(result[0], SharedSegment)
            result[0].close()


def test_a_ring_says_whether_its_daemon_and_its_trainer_hold_it(shm_name):
    name = ring_segment(os.getpid(), "a1b2")
    shm_name.own(name)
    daemon_side = Ring.create(name, RingLayout(slots=2, batch_size=1, imgsz=32, max_targets=1))
    trainer = Ring.attach(name, trainer=True)
    worker = Ring.attach(name)
    assert trainer.daemon_alive() and worker.trainer_holds() and daemon_side.trainer_holds()
    daemon_side.close()  # the daemon is gone
    assert not trainer.daemon_alive()
    assert trainer.leave() == "in use" and os.path.exists(DEFAULT.path(name))  # a worker still maps it
    assert not worker.trainer_holds()
    assert worker.leave() == "removed" and not os.path.exists(DEFAULT.path(name))
