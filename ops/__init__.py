"""Operations: what the service retains and how it runs, measured and shown.

The memory accountant (``accounting``: a snapshot's bytes against a decoded uint8 cache;
``memory_report``: what the daemon, its workers and trainers hold), the client that asks the
daemon for its ``status`` and ``health`` (``status_client``; the replies are declared in
``shared.wire.status`` and built by the daemon), and their faces: ``monitor``'s frames
(``view``) and PNGs (``plot``). The commands in ``cli/`` import them; the daemon's
Prometheus endpoint runs in the daemon (``server/daemon/metrics.py``).

Imports ``pixpool.shared`` only: operations measure and show, they decide nothing
(``docs/architecture.md``).
"""
