"""Operations: what the service retains and how it runs, measured and shown.

The memory accountant (``accounting``: a snapshot's bytes against a decoded uint8 cache;
``memory_report``: what the daemon, its workers and trainers hold), the daemon's ``status``
and ``health`` replies (``status_reply``) and the client that asks for them
(``status_client``), the Prometheus endpoint (``metrics``, ``scrape_server``), and their faces:
``monitor``'s frames (``view``) and PNGs (``plot``). The daemon imports ``status_reply`` and
``metrics``; the commands in ``cli/`` import the rest.

Imports ``pixpool.shared`` only: operations measure and show, they decide nothing
(``docs/architecture.md``).
"""
