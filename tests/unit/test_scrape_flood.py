"""Idle connections do not starve the metrics endpoint's scrapes.

Connections that never send a byte, more than the endpoint's connection cap, are held open
(and in one case opened again as soon as the server closes them); three scrapes must each
be answered with the metrics body within Prometheus' default scrape timeout.

Unit tests: no process is started; the metrics server runs in a thread of this process and
binds 127.0.0.1 on a random port; the idle connections come from 127.0.0.2.
"""

from __future__ import annotations

import socket
import struct
import time

import pytest

from helpers.flood import HeldFlood, IdleFlood, raise_own_nofile
from pixpool.server.daemon.scrape_server import MAX_CONNECTIONS, ScrapeServer

SCRAPE_TIMEOUT_S = 10.0  # Prometheus' default scrape_timeout
BODY = b"pixpool_up 1\n"
_LINGER_0 = struct.pack("ii", 1, 0)


def _scrape(port: int, timeout_s: float) -> bytes | None:
    """The whole reply to one ``GET /metrics`` within ``timeout_s`` from the connect on; None
    where it did not come in that time."""
    deadline = time.monotonic() + timeout_s
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_0)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/plain\r\n\r\n")
            reply = b""
            while (left := deadline - time.monotonic()) > 0:
                s.settimeout(left)
                chunk = s.recv(65536)
                if not chunk:
                    return reply
                reply += chunk
    except (TimeoutError, ConnectionError):
        return None
    return None


@pytest.fixture
def server():
    s = ScrapeServer("127.0.0.1", 0, lambda accept: ("text/plain", BODY)).start()
    yield s
    s.stop()


@pytest.mark.parametrize("idle", [64, 256])
def test_scrapes_are_answered_while_idle_connections_outnumber_the_slots(server, idle):
    if not raise_own_nofile(idle + 256):
        pytest.skip(f"this test holds {idle} sockets; the hard RLIMIT_NOFILE here is lower")
    assert idle > MAX_CONNECTIONS
    with IdleFlood() as flood:
        flood.open("127.0.0.1", server.port, idle, source="127.0.0.2")
        for i in range(3):
            reply = _scrape(server.port, SCRAPE_TIMEOUT_S)
            assert reply is not None, f"scrape {i + 1} of 3 unanswered within {SCRAPE_TIMEOUT_S:g} s"
            assert reply.startswith(b"HTTP/1.1 200 OK\r\n") and reply.endswith(b"\r\n\r\n" + BODY), reply[:200]
    assert server.idle_dropped >= idle - MAX_CONNECTIONS  # the flood made room for the scrapes, not the reverse


def test_scrapes_are_answered_while_a_flood_opens_its_connections_again(server):
    """The idle connections come back as soon as the server closes them, as an attacker's would."""
    per_source = 32
    if not raise_own_nofile(2 * per_source + 256):
        pytest.skip("the hard RLIMIT_NOFILE here is too low")
    with HeldFlood("127.0.0.1", server.port, ["127.0.0.2", "127.0.0.3"], per_source) as flood:
        deadline = time.monotonic() + 30.0
        while flood.reopened < 2 * MAX_CONNECTIONS and time.monotonic() < deadline:
            time.sleep(0.05)  # polling interval of a bounded wait for the flood to turn over
        for i in range(3):
            reply = _scrape(server.port, SCRAPE_TIMEOUT_S)
            assert reply is not None, f"scrape {i + 1} of 3 unanswered within {SCRAPE_TIMEOUT_S:g} s"
            assert reply.endswith(b"\r\n\r\n" + BODY), reply[:200]
