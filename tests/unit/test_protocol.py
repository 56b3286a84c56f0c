"""Unit tests of the wire protocol: validation, version errors, nothing unpickled."""

from __future__ import annotations

import pickle

import msgpack
import pytest

from pixpool.shared.errors import ProtocolError
from pixpool.shared.stream import protocol as proto


def test_round_trip_keeps_fields():
    frame = proto.encode("release", trainer_id=3, token=99, slot=1, epoch=0, batch=4, generation=2)
    msg = proto.decode(frame)
    assert msg == {
        "v": proto.PROTOCOL_VERSION,
        "op": "release",
        "trainer_id": 3,
        "token": 99,
        "slot": 1,
        "epoch": 0,
        "batch": 4,
        "generation": 2,
    }


def test_version_mismatch_names_both_versions():
    frame = msgpack.packb({"v": 99, "op": "status"})
    with pytest.raises(ProtocolError) as err:
        proto.decode(frame)
    assert "99" in str(err.value) and f"version {proto.PROTOCOL_VERSION}" in str(err.value)


@pytest.mark.parametrize(
    "frame, words",
    [
        (b"", "not one valid msgpack"),
        (
            proto.encode("release", trainer_id=1, token=2, slot=3, epoch=0, batch=0, generation=1)[:-2],
            "not one valid msgpack",
        ),
        (proto.encode("status") + b"\x01", "not one valid msgpack"),
        (msgpack.packb([1, 2, 3]), "must be a msgpack map"),
        (msgpack.packb({"v": proto.PROTOCOL_VERSION, "op": "launch"}), "unknown op"),
        (
            msgpack.packb(
                {
                    "v": proto.PROTOCOL_VERSION,
                    "op": "ready",
                    "trainer_id": 1,
                    "slot": 0,
                    "epoch": 0,
                    "batch": 0,
                    "size": 1,
                    "n_targets": 0,
                }
            ),
            "not a request",
        ),
        (
            msgpack.packb({"v": proto.PROTOCOL_VERSION, "op": "release", "trainer_id": 1, "token": 2}),
            "lacks field 'slot'",
        ),
        (
            msgpack.packb({"v": proto.PROTOCOL_VERSION, "op": "release", "trainer_id": 1, "token": 2, "slot": "0"}),
            "field 'slot' must be int",
        ),
        (
            msgpack.packb({"v": proto.PROTOCOL_VERSION, "op": "release", "trainer_id": 1, "token": 2, "slot": True}),
            "got bool",
        ),
        (
            msgpack.packb({"v": proto.PROTOCOL_VERSION, "op": "release", "trainer_id": 1, "token": 2, "slot": 1 << 63}),
            "out of range",
        ),
        (msgpack.packb({"v": proto.PROTOCOL_VERSION, "op": "status", "x": msgpack.ExtType(1, b"zz")}), None),
        (b"\x00" * (proto.MAX_FRAME_BYTES + 1), "exceeds the limit"),
    ],
)
def test_malformed_frames_raise_protocol_error(frame, words):
    if words is None:  # an unknown extension in an ignored field is harmless: no hook runs
        assert proto.decode(frame)["op"] == "status"
        return
    with pytest.raises(ProtocolError) as err:
        proto.decode(frame)
    assert words in str(err.value)


class _Bomb:
    def __reduce__(self):
        return (exec, ("raise SystemExit('unpickled!')",))


def test_pickle_payload_is_refused_not_unpickled():
    with pytest.raises(ProtocolError):
        proto.decode(pickle.dumps(_Bomb()))


def test_replies_use_reply_schema():
    frame = proto.encode("heartbeat", trainer_id=4)
    assert proto.decode(frame, reply=True)["trainer_id"] == 4
    with pytest.raises(ProtocolError, match="token"):
        proto.decode(frame)  # as a request a heartbeat needs its token
    err = proto.decode(proto.error_frame("order", "release of slot 9", trainer_id=2), reply=True)
    assert proto.as_error(err) == "order: release of slot 9"


def test_every_declared_error_code_comes_back_as_its_class():
    from pixpool.shared import errors

    for code, cls in proto.ERROR_CODES.items():
        exc = proto.error_from(proto.decode(proto.error_frame(code, f"{code} happened"), reply=True))
        assert type(exc) is cls and str(exc) == f"{code} happened"
    # The daemon picks the code from the class it raised; the client raises that class again.
    cases = [
        (errors.CapacityError("full"), errors.CapacityError),
        (errors.ConfigError.for_field("slots", 99, "is out of range"), errors.ConfigError),
        (errors.SnapshotError("gone"), errors.SnapshotError),
        (errors.MissingFileError("no file", path="/x.jpg"), errors.DatasetError),  # the nearest declared class
        (errors.RenderError("worker failed"), errors.RenderError),
        (errors.DaemonTimeout("slow"), errors.PixpoolError),  # undeclared: "internal"
    ]
    for raised, expected in cases:
        back = proto.error_from(proto.decode(proto.error_frame_for(raised), reply=True))
        assert type(back) is expected and str(back) == str(raised)
    assert (
        proto.error_from(
            proto.decode(proto.error_frame_for(errors.ConfigError.for_field("slots", 99, "x")), reply=True)
        ).field
        == "slots"
    )
    assert type(proto.error_from({"op": "error", "code": "from-a-newer-daemon", "message": "m"})) is errors.PixpoolError
    with pytest.raises(ValueError, match="undeclared error code"):
        proto.error_frame("made-up", "m")


def test_pipe_messages_are_validated():
    frame = proto.pipe_frame("done", job=3, counts=[2, 0, 5], seconds=0.5)
    assert proto.decode_pipe(frame)["counts"] == [2, 0, 5]
    with pytest.raises(ProtocolError, match="lacks field 'counts'"):
        proto.decode_pipe(proto.pipe_frame("done", job=3, seconds=0.5))
    with pytest.raises(ProtocolError, match="list of target-row counts"):
        proto.decode_pipe(proto.pipe_frame("done", job=3, counts=[1, -1], seconds=0.5))
    with pytest.raises(ProtocolError, match="unknown pipe op"):
        proto.decode_pipe(proto.pipe_frame("exec", code="rm -rf /"))


_ATTACH = {"op": "attach", "settings": {}, "pid": 1, "host": "h", "slots": 2, "delivery": "shm"}


@pytest.mark.parametrize(
    "fields, field, words",
    [
        ({"op": "records", "start": 0, "split": ["train"]}, "split", "must be str"),
        ({"op": "records", "start": 0, "split": "test"}, "split", "not one of"),
        ({"op": "records", "start": -1}, "start", "out of range"),
        ({**_ATTACH, "host": "h" * (proto.MAX_HOST_CHARS + 1)}, "host", "over the limit"),
        ({**_ATTACH, "delivery": "carrier pigeon"}, "delivery", "not one of"),
        ({**_ATTACH, "pid": -5}, "pid", "out of range"),
        ({"op": "heartbeat", "trainer_id": 1, "token": 2, "data_wait_s": float("nan")}, "data_wait_s", "out of range"),
        (
            {"op": "prove", "trainer_id": 1, "token": 2, "nonce": "0" * (proto.MAX_NONCE_CHARS + 1)},
            "nonce",
            "over the limit",
        ),
        ({"op": "start", "trainer_id": 1, "token": 2, "epoch": -1, "batch": 0}, "epoch", "out of range"),
    ],
)
def test_request_fields_are_bounded_and_named(fields, field, words):
    with pytest.raises(ProtocolError) as err:
        proto.decode(msgpack.packb({"v": proto.PROTOCOL_VERSION, **fields}))
    assert err.value.field == field and words in str(err.value) and repr(field) in str(err.value)
    reply = proto.decode(proto.error_frame_for(err.value), reply=True)
    assert reply["code"] == "protocol" and reply["field"] == field
    assert proto.error_from(reply).field == field  # the trainer sees which field was refused


def test_optional_fields_may_be_left_out_and_bounded_ones_pass():
    assert proto.decode(proto.encode("records", start=0))["start"] == 0
    assert proto.decode(proto.encode("heartbeat", trainer_id=1, token=2))["op"] == "heartbeat"
    msg = proto.decode(
        proto.encode(
            "attach",
            settings={},
            pid=1,
            host="h" * proto.MAX_HOST_CHARS,
            slots=2,
            delivery="frames",
            pid_ns="pid:[4026531836]",
        )
    )
    assert len(msg["host"]) == proto.MAX_HOST_CHARS
    assert proto.decode(proto.encode("health"))["op"] == "health"
