"""The parts that keep a daemon up when its descriptors run out, each on
its own: the periodic steps' error counting, the authorized keys kept through a failed look,
the handshake caps, and the metrics server's connection cap and deadlines.

Unit tests: no process is started; the metrics server runs in a thread of this process and
binds 127.0.0.1 on a random port, and every socket is closed in the test.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import struct
import time

import pytest
import zmq.auth

from pixpool.server.daemon.authorized import AuthorizedKeys
from pixpool.server.daemon.handshake_guard import PER_PEER_MAX, TOTAL_MAX, TOTAL_MIN, _peer_key, pending_caps
from pixpool.server.daemon.housekeeping import Housekeeping
from pixpool.server.daemon.scrape_server import MAX_REQUEST_BYTES, ScrapeServer
from pixpool.shared.transport.endpoint import write_keys

_LINGER_0 = struct.pack("ii", 1, 0)


# -- housekeeping ---------------------------------------------------------------------------
def test_an_oserror_in_a_step_is_counted_logged_once_and_retried(caplog):
    hk = Housekeeping(log_every_s=3600.0)
    calls = []

    def flaky(fail: bool) -> None:
        calls.append(fail)
        if fail:
            raise OSError(errno.EMFILE, "Too many open files")

    with caplog.at_level(logging.INFO, logger="pixpool.server.daemon.housekeeping"):
        assert hk.run("the ring sweep", flaky, True) is False
        assert hk.run("the ring sweep", flaky, True) is False
        assert hk.run("the ring sweep", flaky, False) is True
    assert calls == [True, True, False] and hk.errors == {"the ring sweep": 2} and hk.errors_total == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings  # the second failure within log_every_s is counted, not logged
    assert "Too many open files" in warnings[0] and "limit" in warnings[0] and "retries" in warnings[0]
    assert any("works again after 2 failure(s)" in r.getMessage() for r in caplog.records)


def test_other_exceptions_are_not_swallowed():
    with pytest.raises(ZeroDivisionError):
        Housekeeping().run("a bug", lambda: 1 / 0)


# -- authorized keys --------------------------------------------------------------------------
def test_a_look_that_fails_for_want_of_descriptors_keeps_the_last_keys(tmp_path, monkeypatch):
    write_keys(tmp_path / "keys")
    ak = AuthorizedKeys(tmp_path / "keys")
    first = zmq.auth.load_certificate(str(tmp_path / "keys" / "client.key"))[0].decode()
    assert ak.current() == {first}
    real_scandir = os.scandir

    def no_descriptors(path):
        raise OSError(errno.EMFILE, "Too many open files", str(path))

    monkeypatch.setattr(os, "scandir", no_descriptors)
    assert ak.current() == {first} and ak.admits(first) and ak.read_errors == 2  # two looks, both failed
    monkeypatch.setattr(os, "scandir", real_scandir)
    (tmp_path / "keys" / "authorized" / "client.key").unlink()
    assert ak.current() == frozenset()  # the first look that works takes the removal in


def test_a_key_file_unreadable_for_want_of_descriptors_is_not_dropped(tmp_path, monkeypatch):
    write_keys(tmp_path / "keys")
    ak = AuthorizedKeys(tmp_path / "keys")
    first = ak.current()
    (tmp_path / "keys" / "authorized" / "client.key").touch()  # a change: the next look loads again

    def no_descriptors(path):
        raise OSError(errno.EMFILE, "Too many open files", str(path))

    monkeypatch.setattr(zmq.auth, "load_certificate", no_descriptors)
    assert ak.current() == first and ak.read_errors == 1


def test_a_folder_that_is_gone_still_admits_nobody(tmp_path):
    write_keys(tmp_path / "keys")
    ak = AuthorizedKeys(tmp_path / "keys")
    assert ak.current()
    for p in (tmp_path / "keys" / "authorized").iterdir():
        p.unlink()
    (tmp_path / "keys" / "authorized").rmdir()
    assert ak.current() == frozenset() and ak.read_errors == 0


# -- handshake caps ---------------------------------------------------------------------------
def test_handshake_caps_follow_the_free_descriptors():
    assert pending_caps(1024 - 40) == (32, 246)
    assert pending_caps(40) == (4, TOTAL_MIN)
    assert pending_caps(1 << 20) == (PER_PEER_MAX, TOTAL_MAX)


def test_peers_count_by_address_and_ipv6_by_its_64():
    assert _peer_key("10.1.2.3") == "10.1.2.3"
    assert _peer_key("::ffff:10.1.2.3") == "10.1.2.3"
    assert _peer_key("2001:db8:1:2:aaaa::1") == _peer_key("2001:db8:1:2:bbbb::7") == "2001:db8:1:2::/64"
    assert _peer_key("fe80::1%eth0") == "fe80::/64"


# -- the metrics server ---------------------------------------------------------------------
@pytest.fixture
def server():
    made = []

    def start(render=None, **kw) -> ScrapeServer:
        s = ScrapeServer("127.0.0.1", 0, render or (lambda accept: ("text/plain", b"pixpool_up 1\n")), **kw).start()
        made.append(s)
        return s

    yield start
    for s in made:
        s.stop()


@pytest.fixture
def connect():
    made: list[socket.socket] = []

    def make(port: int) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_0)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def _ask(sock: socket.socket, request: bytes) -> bytes:
    sock.sendall(request)
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def test_a_scrape_is_answered_and_other_requests_refused(server, connect):
    s = server()
    reply = _ask(connect(s.port), b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: text/plain\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n") and reply.endswith(b"\r\n\r\npixpool_up 1\n")
    assert b"Content-Length: 13\r\n" in reply and b"Connection: close\r\n" in reply
    assert _ask(connect(s.port), b"HEAD /metrics HTTP/1.1\r\n\r\n").endswith(b"\r\n\r\n")
    assert _ask(connect(s.port), b"GET /secret HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 404")
    assert _ask(connect(s.port), b"POST /metrics HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 405")
    huge = b"GET /metrics HTTP/1.1\r\nX: " + b"a" * MAX_REQUEST_BYTES + b"\r\n\r\n"
    try:
        assert _ask(connect(s.port), huge).startswith(b"HTTP/1.1 431")
    except ConnectionResetError:  # closed with the rest unread: the kernel may send RST before the reply
        pass
    assert _ask(connect(s.port), b"GET / HTTP/1.1\r\n\r\n").endswith(b"pixpool_up 1\n")  # and it goes on


def test_a_render_that_fails_is_a_500_and_the_server_goes_on(server, connect):
    state = {"fail": True}

    def render(accept):
        if state["fail"]:
            raise OSError(errno.EMFILE, "Too many open files")
        return "text/plain", b"ok\n"

    s = server(render)
    assert _ask(connect(s.port), b"GET /metrics HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 500")
    state["fail"] = False
    assert _ask(connect(s.port), b"GET /metrics HTTP/1.1\r\n\r\n").endswith(b"ok\n")


def test_idle_connections_are_capped_and_closed_at_their_deadline(server, connect):
    s = server(max_connections=2, timeout_s=0.5)
    idle = [connect(s.port), connect(s.port)]
    # A third connection at the cap is answered without waiting for a deadline: the oldest
    # idle one is closed to make room for it, the other at its deadline, both without a reply.
    reply = _ask(connect(s.port), b"GET /metrics HTTP/1.1\r\n\r\n")
    assert reply.endswith(b"pixpool_up 1\n") and s.idle_dropped == 1
    for sock in idle:
        assert sock.recv(1) == b""
    assert s.idle_dropped == 1  # the second idle one reached its deadline, it was not displaced


def test_a_connection_that_sends_nothing_is_closed_at_the_first_bytes_deadline(server, connect):
    s = server(timeout_s=30.0, first_bytes_s=0.3)
    silent, slow = connect(s.port), connect(s.port)
    slow.sendall(b"GET /metrics HTTP/1.1\r\n")  # started in time: it keeps the whole timeout_s
    t0 = time.monotonic()
    assert silent.recv(1) == b""
    assert time.monotonic() - t0 < 10.0  # closed at its first-bytes deadline, far before timeout_s
    slow.sendall(b"\r\n")
    assert _ask(slow, b"").endswith(b"pixpool_up 1\n")


def test_the_tcp_listeners_accept_queue_is_as_deep_as_its_handshake_cap(tmp_path):
    """A burst of connections up to the cap is queued by the kernel for libzmq to accept and the
    guard to judge, not dropped past libzmq's default backlog of 100 and retried a second later."""
    from pixpool.server.daemon.listener import Listener
    from pixpool.shared.stream.config import DaemonConfig

    write_keys(tmp_path / "keys")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = DaemonConfig(
        data=str(tmp_path / "data.yaml"),
        socket_dir=str(tmp_path / "sock"),
        tcp=f"127.0.0.1:{port}",
        keys_dir=str(tmp_path / "keys"),
    )
    ctx = zmq.Context()
    listener = Listener(ctx, config)
    try:
        listener.open()
        assert listener.guard is not None and listener.guard.total > 100
        assert listener.remote.getsockopt(zmq.BACKLOG) == listener.guard.total
    finally:
        listener.close()
        listener.release()
        ctx.term()
