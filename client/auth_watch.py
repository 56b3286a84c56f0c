"""Telling a trainer at once that the daemon refused its CURVE key.

Runs in the trainer process, on the thread that owns the Client's main socket. libzmq
reports a refused handshake only as a socket event: without a monitor the trainer would see
nothing but silence, wait its whole ``timeout_s`` and be told to start a daemon. The monitor
(a PAIR socket libzmq writes events to, made in the same context) is read without blocking
each time the Client polls its socket; ``EVENT_HANDSHAKE_FAILED_AUTH`` (the daemon's ZAP
handler said no: the key is not in its ``authorized/`` folder) raises ``NotAuthorized``.
``close`` before the socket's context is terminated.
"""

from __future__ import annotations

import os
from pathlib import Path

import zmq
import zmq.auth
from zmq.utils.monitor import recv_monitor_message

from ..shared.errors import NotAuthorized


class AuthWatch:
    def __init__(self, sock: zmq.Socket, endpoint: str, keys_dir: str | os.PathLike):
        self.endpoint = endpoint
        self.keys_dir = Path(keys_dir)
        self._sock = sock
        self._monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH)
        self._monitor.setsockopt(zmq.LINGER, 0)

    def check(self) -> None:
        """NotAuthorized if the daemon refused this socket's key since the last check."""
        while self._monitor.poll(0):
            event = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            if event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                key_file = self.keys_dir / "client.key"
                public = zmq.auth.load_certificate(str(key_file))[0].decode() if key_file.is_file() else "?"
                raise NotAuthorized(
                    f"the pixpool daemon at {self.endpoint} refused this trainer's CURVE key {public} "
                    f"({key_file}; ZAP status {event['value']}): it is not in the daemon's authorized/ folder. "
                    f"Copy {key_file} into that folder (as authorized/<name>.key) on the "
                    f"daemon's machine, or use a key pair `pixpool keys DIR` made there"
                )

    def close(self) -> None:
        if not self._sock.closed:
            try:
                self._sock.disable_monitor()
            except zmq.ZMQError:
                pass
        self._monitor.close(linger=0)
