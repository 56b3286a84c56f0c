"""Unit tests of the wire protocol: every declared op, validation on both sides, version errors,
nothing unpickled, and the daemon's dispatch tables covering every request."""

from __future__ import annotations

import pickle

import msgpack
import pytest

from pixpool.shared import schema
from pixpool.shared.errors import ProtocolError
from pixpool.shared.wire import error_codes, trainer, worker_pipe


def test_round_trip_keeps_fields():
    frame = trainer.encode("release", trainer_id=3, token=99, slot=1, epoch=0, batch=4, generation=2)
    msg = trainer.decode(frame)
    assert msg == {
        "v": trainer.PROTOCOL_VERSION,
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
        trainer.decode(frame)
    assert "99" in str(err.value) and f"version {trainer.PROTOCOL_VERSION}" in str(err.value)


@pytest.mark.parametrize(
    "frame, words",
    [
        (b"", "not one valid msgpack"),
        (
            trainer.encode("release", trainer_id=1, token=2, slot=3, epoch=0, batch=0, generation=1)[:-2],
            "not one valid msgpack",
        ),
        (trainer.encode("status") + b"\x01", "not one valid msgpack"),
        (msgpack.packb([1, 2, 3]), "must be a msgpack map"),
        (msgpack.packb({"v": trainer.PROTOCOL_VERSION, "op": "launch"}), "unknown op"),
        (
            msgpack.packb(
                {
                    "v": trainer.PROTOCOL_VERSION,
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
            msgpack.packb({"v": trainer.PROTOCOL_VERSION, "op": "release", "trainer_id": 1, "token": 2}),
            "lacks field 'slot'",
        ),
        (
            msgpack.packb({"v": trainer.PROTOCOL_VERSION, "op": "release", "trainer_id": 1, "token": 2, "slot": "0"}),
            "field 'slot' must be int",
        ),
        (
            msgpack.packb({"v": trainer.PROTOCOL_VERSION, "op": "release", "trainer_id": 1, "token": 2, "slot": True}),
            "got bool",
        ),
        (
            msgpack.packb(
                {"v": trainer.PROTOCOL_VERSION, "op": "release", "trainer_id": 1, "token": 2, "slot": 1 << 63}
            ),
            "out of range",
        ),
        (msgpack.packb({"v": trainer.PROTOCOL_VERSION, "op": "status", "x": msgpack.ExtType(1, b"zz")}), None),
        (b"\x00" * (trainer.MAX_FRAME_BYTES + 1), "exceeds the limit"),
    ],
)
def test_malformed_frames_raise_protocol_error(frame, words):
    if words is None:  # an unknown extension in an ignored field is harmless: no hook runs
        assert trainer.decode(frame)["op"] == "status"
        return
    with pytest.raises(ProtocolError) as err:
        trainer.decode(frame)
    assert words in str(err.value)


class _Bomb:
    def __reduce__(self):
        return (exec, ("raise SystemExit('unpickled!')",))


def test_pickle_payload_is_refused_not_unpickled():
    with pytest.raises(ProtocolError):
        trainer.decode(pickle.dumps(_Bomb()))


def test_replies_use_reply_schema():
    frame = trainer.encode_reply("heartbeat", trainer_id=4)
    assert trainer.decode(frame, reply=True)["trainer_id"] == 4
    with pytest.raises(ProtocolError, match="token"):
        trainer.decode(frame)  # as a request a heartbeat needs its token
    err = trainer.decode(error_codes.error_frame("order", "release of slot 9", trainer_id=2), reply=True)
    assert error_codes.as_error(err) == "order: release of slot 9"


def test_every_declared_error_code_comes_back_as_its_class():
    from pixpool.shared import errors

    for code, cls in error_codes.ERROR_CODES.items():
        exc = error_codes.error_from(trainer.decode(error_codes.error_frame(code, f"{code} happened"), reply=True))
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
        back = error_codes.error_from(trainer.decode(error_codes.error_frame_for(raised), reply=True))
        assert type(back) is expected and str(back) == str(raised)
    assert (
        error_codes.error_from(
            trainer.decode(error_codes.error_frame_for(errors.ConfigError.for_field("slots", 99, "x")), reply=True)
        ).field
        == "slots"
    )
    assert (
        type(error_codes.error_from({"op": "error", "code": "from-a-newer-daemon", "message": "m"}))
        is errors.PixpoolError
    )
    with pytest.raises(ValueError, match="undeclared error code"):
        error_codes.error_frame("made-up", "m")


def test_pipe_messages_are_validated():
    frame = worker_pipe.pipe_frame("done", job=3, counts=[2, 0, 5], seconds=0.5)
    assert worker_pipe.decode_pipe(frame)["counts"] == [2, 0, 5]
    # What arrives is checked whoever packed it (``pipe_frame`` would refuse the first and last).
    with pytest.raises(ProtocolError, match="lacks field 'counts'"):
        worker_pipe.decode_pipe(msgpack.packb({"op": "done", "job": 3, "seconds": 0.5}))
    with pytest.raises(ProtocolError, match="list of target-row counts"):
        worker_pipe.decode_pipe(worker_pipe.pipe_frame("done", job=3, counts=[1, -1], seconds=0.5))
    with pytest.raises(ProtocolError, match="unknown pipe op"):
        worker_pipe.decode_pipe(msgpack.packb({"op": "exec", "code": "rm -rf /"}))


_ATTACH = {"op": "attach", "settings": {}, "pid": 1, "host": "h", "slots": 2, "delivery": "shm"}


@pytest.mark.parametrize(
    "fields, field, words",
    [
        ({"op": "records", "start": 0, "split": ["train"]}, "split", "must be str"),
        ({"op": "records", "start": 0, "split": "test"}, "split", "not one of"),
        ({"op": "records", "start": -1}, "start", "out of range"),
        ({**_ATTACH, "host": "h" * (trainer.MAX_HOST_CHARS + 1)}, "host", "over the limit"),
        ({**_ATTACH, "delivery": "carrier pigeon"}, "delivery", "not one of"),
        ({**_ATTACH, "pid": -5}, "pid", "out of range"),
        ({"op": "heartbeat", "trainer_id": 1, "token": 2, "data_wait_s": float("nan")}, "data_wait_s", "out of range"),
        (
            {"op": "prove", "trainer_id": 1, "token": 2, "nonce": "0" * (trainer.MAX_NONCE_CHARS + 1)},
            "nonce",
            "over the limit",
        ),
        ({"op": "start", "trainer_id": 1, "token": 2, "epoch": -1, "batch": 0}, "epoch", "out of range"),
    ],
)
def test_request_fields_are_bounded_and_named(fields, field, words):
    with pytest.raises(ProtocolError) as err:
        trainer.decode(msgpack.packb({"v": trainer.PROTOCOL_VERSION, **fields}))
    assert err.value.field == field and words in str(err.value) and repr(field) in str(err.value)
    reply = trainer.decode(error_codes.error_frame_for(err.value), reply=True)
    assert reply["code"] == "protocol" and reply["field"] == field
    assert error_codes.error_from(reply).field == field  # the trainer sees which field was refused


def test_optional_fields_may_be_left_out_and_bounded_ones_pass():
    assert trainer.decode(trainer.encode("records", start=0))["start"] == 0
    assert trainer.decode(trainer.encode("heartbeat", trainer_id=1, token=2))["op"] == "heartbeat"
    msg = trainer.decode(
        trainer.encode(
            "attach",
            settings={},
            pid=1,
            host="h" * trainer.MAX_HOST_CHARS,
            slots=2,
            delivery="frames",
            pid_ns="pid:[4026531836]",
        )
    )
    assert len(msg["host"]) == trainer.MAX_HOST_CHARS
    assert trainer.decode(trainer.encode("health"))["op"] == "health"


def _valid(spec: schema.Field):
    """A value ``spec`` admits, at the edge of its bounds where it has them."""
    if spec.choices is not None:
        return spec.choices[-1]
    kind = spec.types[0]
    if kind is bool:
        return True
    if kind is int:
        return int(max(spec.lo, 0))
    if kind is float:
        return float(max(spec.lo, 0.0)) + 0.5
    if kind is str:
        return "s" * (spec.max_len or 8)
    return kind()  # dict, list


_TABLES = [
    ("request", trainer.REQUESTS, trainer.encode, lambda frame: trainer.decode(frame)),
    ("reply", trainer.REPLIES, trainer.encode_reply, lambda frame: trainer.decode(frame, reply=True)),
    ("pipe", worker_pipe.PIPE, worker_pipe.pipe_frame, worker_pipe.decode_pipe),
]


@pytest.mark.parametrize("kind, table, encode, decode", _TABLES, ids=[t[0] for t in _TABLES])
def test_every_declared_op_encodes_and_decodes_back(kind, table, encode, decode):
    assert table, "the table declares ops"
    for op, message in table.items():
        assert message.about, f"{kind} {op} says what it means"
        for name, spec in message.fields.items():
            assert spec.about, f"{kind} {op}: field {name!r} says what it means"
        every = {name: _valid(spec) for name, spec in message.fields.items()}
        required = {name: value for name, value in every.items() if not message.fields[name].optional}
        for fields in (every, required):
            back = decode(encode(op, **fields))
            assert back.pop("op") == op and back.pop("v", trainer.PROTOCOL_VERSION) == trainer.PROTOCOL_VERSION
            assert back == fields, (kind, op)


def test_op_members_are_the_wire_strings_and_the_bytes_are_unchanged():
    assert trainer.Op.READY == "ready" and {"ready": 1}[trainer.Op.READY] == 1  # string comparisons still hold
    assert {op.value for op in trainer.Op} == set(trainer.REQUESTS) | set(trainer.REPLIES)
    fields = {"trainer_id": 3, "token": 99, "slot": 1, "epoch": 0, "batch": 4, "generation": 2}
    frame = trainer.encode(trainer.Op.RELEASE, **fields)
    assert frame == trainer.encode("release", **fields)
    assert frame == msgpack.packb({"v": trainer.PROTOCOL_VERSION, "op": "release", **fields}, use_bin_type=True)
    assert worker_pipe.pipe_frame("stop") == msgpack.packb({"op": "stop"}, use_bin_type=True)


_RELEASE = {"trainer_id": 3, "token": 99, "slot": 1, "epoch": 0, "batch": 4, "generation": 2}
_READY = {"trainer_id": 3, "slot": 1, "epoch": 0, "batch": 4, "generation": 2, "size": 4, "n_targets": 0}


@pytest.mark.parametrize(
    "encode, op, fields, field, words",
    [
        (trainer.encode, "release", {k: v for k, v in _RELEASE.items() if k != "slot"}, "slot", "lacks field 'slot'"),
        (trainer.encode, "release", {**_RELEASE, "slot": "1"}, "slot", "must be int, got str"),
        (trainer.encode, "release", {**_RELEASE, "epoch": -1}, "epoch", "out of range"),
        (trainer.encode, "release", {**_RELEASE, "slto": 1}, "slto", "with field 'slto'"),
        (trainer.encode, "prove", {"trainer_id": 1, "token": 2, "nonce": "n" * 5000}, "nonce", "over the limit"),
        (trainer.encode_reply, "ready", {**_READY, "n_targets": True}, "n_targets", "got bool"),
        (trainer.encode_reply, "error", {"code": "protocol", "message": 5}, "message", "must be str"),
        (worker_pipe.pipe_frame, "done", {"job": 1, "counts": (1, 2), "seconds": 0.5}, "counts", "must be list"),
    ],
)
def test_encode_refuses_a_bad_field_on_the_sending_side(encode, op, fields, field, words):
    with pytest.raises(ProtocolError) as err:
        encode(op, **fields)
    assert err.value.field == field and words in str(err.value) and repr(op) in str(err.value)


def test_encode_refuses_an_op_of_the_other_direction_or_none():
    with pytest.raises(ProtocolError, match="cannot send request op 'ready'"):
        trainer.encode("ready", trainer_id=1, slot=0, epoch=0, batch=0, generation=1, size=1, n_targets=0)
    with pytest.raises(ProtocolError, match="cannot send reply op 'attach'"):
        trainer.encode_reply("attach")
    with pytest.raises(ProtocolError, match="cannot send pipe op 'exec'"):
        worker_pipe.pipe_frame("exec", code="rm -rf /")


def test_the_daemon_and_supervisor_dispatch_every_op_they_receive():
    from pixpool.server.daemon import service, supervisor

    open_ops, session_ops = set(service._OPEN_REQUESTS), set(service._SESSION_REQUESTS)
    assert not open_ops & session_ops, "each request has one handler"
    assert open_ops | session_ops == set(trainer.REQUESTS)
    assert set(supervisor._FROM_WORKER) == {
        worker_pipe.PipeOp.HELLO,
        worker_pipe.PipeOp.DONE,
        worker_pipe.PipeOp.FAILED,
    }
