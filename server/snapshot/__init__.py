"""The prepared snapshot: decode once, keep in shared memory, attach by name.

Runs in the preparing process (``pixpool prepare``, the daemon at start-up), its decode
workers, and every process that reads a snapshot (augmentation workers, ``pixpool ls``).
Modules: ``layout`` (byte layout, pure arithmetic), ``fingerprint`` (what names a
snapshot), ``decode`` (file -> centred float32), ``prepare`` and ``decode_worker`` (the
all-or-nothing preparation), ``handle`` (``Snapshot``: attach read-only, release),
``reference`` (the no-snapshot source the parity tests compare against), ``label_index`` (what
lets a restart skip reading labels), ``load`` (``load_split``: one split's snapshot, for the
daemon and ``pixpool prepare``).

Nothing is imported here: a spawned decode worker imports ``decode_worker`` and must not
pay for numpy and OpenCV before it has limited their threads. The public names are
re-exported, lazily, by ``pixpool.server``.
"""
