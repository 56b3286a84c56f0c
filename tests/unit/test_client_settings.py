"""The stream settings a Client ends up with: a trainer that leaves ``imgsz`` to the daemon
gets the daemon's, from the ``attached`` reply (or its ring layout, from a daemon that does
not send ``imgsz``); one that names it keeps its own."""

from __future__ import annotations

import dataclasses

import pytest

from pixpool.client.client import settings_with_daemon_imgsz
from pixpool.shared.errors import ConfigError
from pixpool.shared.stream.config import AugmentConfig, StreamSettings


def _attached(imgsz: int | None, layout_imgsz: int) -> dict:
    reply = {"layout": {"imgsz": layout_imgsz, "slots": 2, "batch_size": 4, "max_targets": 8}}
    if imgsz is not None:
        reply["imgsz"] = imgsz
    return reply


def _left_to_the_daemon() -> StreamSettings:
    try:
        augment = AugmentConfig(imgsz=None, mosaic=0.5)
    except (ConfigError, TypeError):
        pytest.skip("AugmentConfig.imgsz is not optional in this tree yet (it comes with the config change)")
    return StreamSettings(seed=3, batch_size=4, augment=augment)


def test_a_named_imgsz_is_kept():
    s = StreamSettings(augment=AugmentConfig(imgsz=320))
    assert settings_with_daemon_imgsz(s, _attached(640, 640)) is s


def test_imgsz_left_to_the_daemon_takes_the_attach_reply():
    s = _left_to_the_daemon()
    got = settings_with_daemon_imgsz(s, _attached(416, 416))
    assert got.augment.imgsz == 416
    assert dataclasses.replace(got, augment=dataclasses.replace(got.augment, imgsz=None)) == s  # nothing else


def test_imgsz_from_a_daemon_that_does_not_send_it_is_the_ring_layouts():
    s = _left_to_the_daemon()
    assert settings_with_daemon_imgsz(s, _attached(None, 256)).augment.imgsz == 256
