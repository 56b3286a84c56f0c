"""The stream settings a Client ends up with: ``StreamSettings.for_imgsz`` with the ``attached``
reply's ``imgsz`` (``client/client.py``). A trainer that leaves ``imgsz`` to the daemon gets the
daemon's; one that names it keeps its own. Every ``attached`` reply carries ``imgsz`` (the
protocol refuses one without it), so the client has no other source to fall back on."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest

from pixpool.shared.errors import ConfigError, ProtocolError
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
from pixpool.shared.wire.trainer import PROTOCOL_VERSION, decode


def _attached(imgsz: int | None, layout_imgsz: int) -> dict:
    """An ``attached`` reply as the trainer decodes it (``imgsz`` None: left out)."""
    reply = {
        "trainer_id": 1,
        "token": 2,
        "ring": "r",
        "layout": {"imgsz": layout_imgsz, "slots": 2, "batch_size": 4, "max_targets": 8},
        "num_records": 3,
        "daemon_pid": 9,
        "host": "h",
        "task": "detect",
        "kpt_shape": None,
        "flip_idx": None,
        "store": "/dev/shm",
    }
    if imgsz is not None:
        reply["imgsz"] = imgsz
    frame = msgpack.packb({"v": PROTOCOL_VERSION, "op": "attached", **reply}, use_bin_type=True)
    return decode(frame, reply=True)


def _left_to_the_daemon() -> StreamSettings:
    try:
        augment = AugmentConfig(imgsz=None, mosaic=0.5)
    except (ConfigError, TypeError):
        pytest.skip("AugmentConfig.imgsz is not optional in this tree yet (it comes with the config change)")
    return StreamSettings(seed=3, batch_size=4, augment=augment)


def test_a_named_imgsz_is_kept():
    s = StreamSettings(augment=AugmentConfig(imgsz=320))
    assert s.for_imgsz(_attached(320, 320)["imgsz"]) is s


def test_a_named_imgsz_the_daemon_does_not_serve_is_a_config_error():
    s = StreamSettings(augment=AugmentConfig(imgsz=320))
    with pytest.raises(ConfigError, match="asks for imgsz 320 but the daemon serves imgsz 640") as info:
        s.for_imgsz(_attached(640, 640)["imgsz"])
    assert info.value.field == "imgsz"


def test_imgsz_left_to_the_daemon_takes_the_attach_reply():
    s = _left_to_the_daemon()
    got = s.for_imgsz(_attached(416, 416)["imgsz"])
    assert got.augment.imgsz == 416
    assert dataclasses.replace(got, augment=dataclasses.replace(got.augment, imgsz=None)) == s  # nothing else


def test_an_attach_reply_without_imgsz_is_refused():
    with pytest.raises(ProtocolError, match="lacks field 'imgsz'") as info:
        _attached(None, 256)
    assert info.value.field == "imgsz"
