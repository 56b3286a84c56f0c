"""Unit tests of the daemon's live view of ``authorized/`` and of its request intake (no
processes; sockets over inproc only)."""

from __future__ import annotations

import os
import shutil

import pytest
import zmq
import zmq.auth

from pixpool.server.daemon.authorized import AuthorizedKeys
from pixpool.server.daemon.intake import read_request
from pixpool.shared.transport.endpoint import write_keys
from pixpool.shared.wire.trainer import MAX_REQUEST_BYTES, decode, encode


def _public(path) -> str:
    return zmq.auth.load_certificate(str(path))[0].decode()


@pytest.fixture
def keys(tmp_path):
    write_keys(tmp_path / "keys")
    return tmp_path / "keys"


def test_added_removed_and_rewritten_keys_take_effect(keys, tmp_path):
    ak = AuthorizedKeys(keys)
    first = _public(keys / "client.key")
    assert ak.current() == {first}
    pub, _ = zmq.auth.create_certificates(str(tmp_path), "second")
    os.chmod(pub, 0o644)
    shutil.copy(pub, keys / "authorized" / "second.key")
    second = _public(pub)
    assert ak.current() == {first, second} and ak.admits(second)
    (keys / "authorized" / "client.key").unlink()
    assert ak.current() == {second} and not ak.admits(first)
    shutil.copy(keys / "client.key", keys / "authorized" / "second.key")  # rewritten in place: another key
    assert ak.current() == {first}
    assert ak.callback("*", first.encode()) and not ak.callback("*", second.encode())


def test_a_folder_others_can_write_admits_nobody_until_fixed(keys):
    ak = AuthorizedKeys(keys)
    assert len(ak.current()) == 1
    os.chmod(keys / "authorized", 0o777)
    assert ak.current() == frozenset()
    os.chmod(keys / "authorized", 0o700)
    assert len(ak.current()) == 1


def test_a_file_that_is_no_key_is_skipped(keys):
    (keys / "authorized" / "junk.key").write_text("not a certificate\n")
    os.chmod(keys / "authorized" / "junk.key", 0o644)
    assert AuthorizedKeys(keys).current() == {_public(keys / "client.key")}


def test_unchanged_folder_is_not_read_again(keys):
    ak = AuthorizedKeys(keys)
    for _ in range(5):
        ak.current()
    assert ak.reloads == 1


@pytest.fixture
def pair():
    ctx = zmq.Context.instance()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    router.bind("inproc://intake-test")
    dealer.connect("inproc://intake-test")
    yield router, dealer
    router.close(linger=0)
    dealer.close(linger=0)


def test_intake_keeps_no_frame_of_a_message_past_the_limits(pair):
    router, dealer = pair
    dealer.send_multipart([b"a" * 1000] * 50)
    assert router.poll(5000)
    req = read_request(router)
    assert req.frames == [] and req.frames_sent == 50 and req.nbytes_sent == 50_000
    assert "got 50" in req.problem()
    dealer.send(b"b" * (MAX_REQUEST_BYTES + 1))
    assert router.poll(5000)
    req = read_request(router)
    assert req.frames == [] and "exceeds the limit" in req.problem()
    dealer.send(encode("status"))
    assert router.poll(5000)
    req = read_request(router)
    assert req.problem() is None and decode(req.frames[0])["op"] == "status"
    assert read_request(router) is None  # nothing waiting
