"""``ScrapeServer``: the metrics endpoint's HTTP server, with a connection cap and deadlines.

Runs in the daemon process, in one thread of its own (``metrics.Metrics`` starts and stops
it). It replaces prometheus-client's ``start_http_server``, whose server starts a thread per
connection and waits on each without a timeout: 1,000 idle connections held 1,000 threads
and the daemon's whole descriptor table. Here:

- At most ``max_connections`` connections are open at once. At the cap the listener is still
  read: a new connection is accepted and the oldest one that has not sent a whole request
  yet is closed to make room (counted in ``idle_dropped``). Leaving the listener unread at
  the cap instead let 64 idle connections starve every scrape: each idle one held its slot
  for ``timeout_s`` and the scrapes waited behind the rest in the kernel's queue, past
  Prometheus' 10 s scrape timeout. A scraper sends its request the moment it connects and
  is answered in the same step, so a flood cannot displace it. Only when every slot is
  busy sending a reply is the listener left unread (then new connections wait in the
  kernel's accept queue, ``BACKLOG``, which costs the daemon no descriptor).
- Each connection has ``first_bytes_s`` from its accept to send the first bytes of its
  request and ``timeout_s`` to send all of it and take the reply; then it is closed,
  whatever it did or did not send.
- A request is at most ``MAX_REQUEST_BYTES``, headers included. ``GET`` or ``HEAD`` of
  ``/metrics`` (or ``/``) is answered with ``render(accept_header) -> (content_type, body)``;
  anything else gets a short 4xx. One request per connection (``Connection: close``).
- An accept that fails (``EMFILE``: the process is out of descriptors) pauses accepting
  for ``ACCEPT_PAUSE_S`` rather than spinning on a listener that stays readable; it is
  counted in ``accept_errors``.

All sockets are non-blocking and watched by one selector (epoll), so no descriptor number
is too high for it.
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

__all__ = ["ACCEPT_PAUSE_S", "FIRST_BYTES_S", "MAX_CONNECTIONS", "MAX_REQUEST_BYTES", "TIMEOUT_S", "ScrapeServer"]

log = logging.getLogger(__name__)

# A Prometheus server scrapes with one connection at a time; a few more leave room for a
# person's curl and a second scraper (an HA pair).
MAX_CONNECTIONS = 16
TIMEOUT_S = 5.0
# A scraper (Prometheus, curl) sends its request as soon as the connection is up: one round
# trip, far under this even across a continent.
FIRST_BYTES_S = 2.0
# Connections waiting in the kernel while every slot sends a reply; they cost no descriptor.
BACKLOG = 128
MAX_REQUEST_BYTES = 8192
ACCEPT_PAUSE_S = 0.5
_PATHS = ("/metrics", "/")


class _Conn:
    __slots__ = ("deadline", "end", "inbox", "outbox", "sent", "sock")

    def __init__(self, sock: socket.socket, first_bytes_by: float, end: float):
        # ``deadline`` is the nearer of the two until the first bytes arrive, ``end`` after.
        self.sock, self.deadline, self.end = sock, min(first_bytes_by, end), end
        self.inbox = bytearray()
        self.outbox: bytes | None = None
        self.sent = 0


class ScrapeServer:
    """Answer scrapes on ``host:port`` (module docstring); ``start`` binds (errors surface
    there, in the caller), ``stop`` closes every socket and joins the thread."""

    def __init__(
        self,
        host: str,
        port: int,
        render: Callable[[str], tuple[str, bytes]],
        *,
        max_connections: int = MAX_CONNECTIONS,
        timeout_s: float = TIMEOUT_S,
        first_bytes_s: float = FIRST_BYTES_S,
    ):
        self.host, self.port = host, port
        self.max_connections, self.timeout_s, self.first_bytes_s = max_connections, timeout_s, first_bytes_s
        self.accept_errors = 0
        self.idle_dropped = 0  # connections closed before a whole request, to make room at the cap
        self._render = render
        self._listener: socket.socket | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._stopping = False
        self._thread: threading.Thread | None = None

    def start(self) -> ScrapeServer:
        family, _, _, _, address = socket.getaddrinfo(
            self.host, self.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        self._listener = socket.create_server(address, family=family, backlog=max(BACKLOG, self.max_connections))
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]  # the port bound, where 0 asked for any
        self._thread = threading.Thread(target=self._serve, name="pixpool-metrics", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stopping = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        for s in (self._listener, self._wake_r, self._wake_w):
            if s is not None:
                s.close()
        self._listener = None

    # -- the server thread -------------------------------------------------------------------
    def _serve(self) -> None:
        conns: dict[socket.socket, _Conn] = {}
        with selectors.DefaultSelector() as sel:
            sel.register(self._wake_r, selectors.EVENT_READ)
            listening, paused_until = False, 0.0
            try:
                while not self._stopping:
                    now = time.monotonic()
                    # At the cap a new connection displaces the oldest idle one; with none idle (or
                    # during a pause) the listener is not watched: connections wait in the
                    # kernel's queue, not in the daemon's descriptor table.
                    want = now >= paused_until and (
                        len(conns) < self.max_connections or any(c.outbox is None for c in conns.values())
                    )
                    if want and not listening:
                        sel.register(self._listener, selectors.EVENT_READ)
                    elif listening and not want:
                        sel.unregister(self._listener)
                    listening = want
                    wake = min(
                        [c.deadline for c in conns.values()] + [paused_until if paused_until > now else now + 1.0]
                    )
                    for key, _ in sel.select(max(0.0, wake - now)):
                        if key.fileobj is self._listener:
                            paused_until = self._accept(sel, conns)
                        elif key.fileobj is not self._wake_r and key.fileobj in conns:  # not closed to make room
                            self._step(sel, conns, conns[key.fileobj])
                    now = time.monotonic()
                    for c in [c for c in conns.values() if now >= c.deadline]:
                        self._close(sel, conns, c)
            except Exception:  # a bug here must not end the daemon; scrapes stop and it says why
                log.exception("the metrics endpoint on %s:%d stopped", self.host, self.port)
            finally:
                for c in list(conns.values()):
                    self._close(sel, conns, c)

    def _accept(self, sel: selectors.BaseSelector, conns: dict) -> float:
        """Accept one connection, at the cap in place of the oldest idle one; the time until which
        accepting pauses (0: no pause)."""
        try:
            sock, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return 0.0
        except OSError as exc:  # EMFILE, ENFILE, ENOBUFS: out of something; try again shortly
            self.accept_errors += 1
            if self.accept_errors == 1 or self.accept_errors % 1000 == 0:
                log.warning("metrics endpoint: accept failed (%s), %d time(s); pausing %.1f s", exc,
                            self.accept_errors, ACCEPT_PAUSE_S)  # fmt: skip
            return time.monotonic() + ACCEPT_PAUSE_S
        if len(conns) >= self.max_connections:
            # conns are in accept order: the first without a whole request is the oldest idle
            # (there is one: the listener is watched at the cap only then).
            oldest_idle = next((c for c in conns.values() if c.outbox is None), None)
            if oldest_idle is not None:
                self._close(sel, conns, oldest_idle)
                self.idle_dropped += 1
                if self.idle_dropped == 1 or self.idle_dropped % 1000 == 0:
                    log.warning("metrics endpoint: %d connection(s) closed before a whole request, to make room "
                                "for newer ones past %d open; something opens connections and sends nothing",
                                self.idle_dropped, self.max_connections)  # fmt: skip
        sock.setblocking(False)
        now = time.monotonic()
        conns[sock] = _Conn(sock, now + self.first_bytes_s, now + self.timeout_s)
        sel.register(sock, selectors.EVENT_READ)
        return 0.0

    def _step(self, sel: selectors.BaseSelector, conns: dict, c: _Conn) -> None:
        try:
            if c.outbox is None:
                chunk = c.sock.recv(MAX_REQUEST_BYTES + 1 - len(c.inbox))
                if not chunk:
                    self._close(sel, conns, c)
                    return
                c.inbox += chunk
                c.deadline = c.end
                head_end = c.inbox.find(b"\r\n\r\n")
                if head_end < 0:
                    if len(c.inbox) > MAX_REQUEST_BYTES:
                        c.outbox = _reply(431, "text/plain", b"request headers over 8192 bytes\n")
                    else:
                        return
                else:
                    c.outbox = self._answer(bytes(c.inbox[:head_end]))
                sel.modify(c.sock, selectors.EVENT_WRITE)
            c.sent += c.sock.send(c.outbox[c.sent :])
            if c.sent >= len(c.outbox):
                self._close(sel, conns, c)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(sel, conns, c)

    def _answer(self, head: bytes) -> bytes:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split()
        if len(parts) != 3:
            return _reply(400, "text/plain", b"bad request line\n")
        method, target, _ = parts
        if method not in ("GET", "HEAD"):
            return _reply(405, "text/plain", b"only GET and HEAD\n")
        if urlsplit(target).path not in _PATHS:
            return _reply(404, "text/plain", b"not found: the metrics are at /metrics\n")
        accept = next((v.strip() for k, _, v in (h.partition(":") for h in lines[1:]) if k.lower() == "accept"), "")
        try:
            content_type, body = self._render(accept)
        except Exception as exc:  # an OSError measuring a process, a bug in a collector
            log.warning("metrics endpoint: rendering the metrics failed: %s: %s", type(exc).__name__, exc)
            return _reply(500, "text/plain", f"metrics failed: {type(exc).__name__}: {exc}\n".encode())
        return _reply(200, content_type, body, head_only=method == "HEAD")

    def _close(self, sel: selectors.BaseSelector, conns: dict, c: _Conn) -> None:
        conns.pop(c.sock, None)
        try:
            sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass
        c.sock.close()


_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
}


def _reply(code: int, content_type: str, body: bytes, *, head_only: bool = False) -> bytes:
    head = (
        f"HTTP/1.1 {code} {_REASONS[code]}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode("latin-1")
    return head if head_only else head + body
