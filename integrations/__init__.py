"""Bridges from pixpool's stream to other training frameworks, each an optional extra.

Trainer side: these modules import ``pixpool.client`` and ``pixpool.shared``, never the
producer (``pixpool.server``). ``ultralytics``: train Ultralytics models on a pixpool daemon
(``pip install 'pixpool[ultralytics]'``).
"""
