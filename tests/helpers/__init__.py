"""Helpers the tests share: daemons in spawned processes, hand-built datasets and sources, a wedged renderer."""
