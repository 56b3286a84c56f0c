"""The producer daemon: sockets and admission, trainer sessions, worker supervision, the
scheduler, and the loop that ties them together.

Runs in the daemon process; ``worker`` runs in its spawned augmentation workers. Modules:
``run`` (``run_daemon``: preflight, snapshot, serve, release), ``service`` (``Daemon``:
the loop), ``preflight`` (settings checked before anything is decoded), ``listener`` (sockets,
keys), ``admission`` (what an attach gets), ``sweeps`` (dead daemons' rings), ``store_watch``
(the store's free space), ``sessions`` (trainers and
their rings), ``supervisor`` (worker processes), ``worker`` (a worker's own loop),
``scheduler`` (jobs, slots, order), ``delivery`` (how a batch reaches its trainer),
``renderer`` (the route behind one module name), ``metrics`` and ``scrape_server`` (the
Prometheus endpoint). The ``status`` and ``health`` replies (declared in ``shared.wire.status``)
are ``Daemon.status`` and ``Daemon.health``: the supervisor describes its workers, the
sessions their trainers.

Nothing is imported here: a spawned worker imports ``worker`` and pays only for it. The
public names are re-exported, lazily, by ``pixpool.server``.
"""
