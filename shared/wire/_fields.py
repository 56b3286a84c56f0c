"""How a wire message's fields are declared and checked: what the trainer protocol (``trainer``)
and the worker pipe (``worker_pipe``) share.

Code both sides import. A field is a ``shared.schema.Field``; the helpers here bound its numbers
by default to +/- ``INT_LIMIT`` (msgpack's integers reach 2**64, no message needs that much).
``check_fields`` checks a message against its op's fields and ``check_outgoing`` what a sender
packs against its table; both word ``shared.schema``'s violation as a ``ProtocolError`` naming
the op and the field (ranges are half-open: ``use 0 <= slots < 65536``).
"""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import ProtocolError
from ..schema import NONE, Field, Message, Violation, check

INT_LIMIT = 1 << 62


def wire_field(types: tuple[type, ...], about: str, **rules: Any) -> Field:
    """A field of ``types``, its numbers within +/- ``INT_LIMIT`` unless ``rules`` say otherwise."""
    return Field(types, about, **{"lo": -INT_LIMIT, "hi": INT_LIMIT, **rules})


def int_field(about: str, **rules: Any) -> Field:
    return wire_field((int,), about, **rules)


def id_field(about: str) -> Field:  # trainer ids and tokens: 0 .. 2**62
    return wire_field((int,), about, lo=0)


def count_field(about: str) -> Field:  # epochs, batches, record positions
    return wire_field((int,), about, lo=0, hi=1 << 40)


def str_field(about: str, **rules: Any) -> Field:
    return wire_field((str,), about, **rules)


def map_field(about: str) -> Field:
    return wire_field((dict,), about)


def list_field(about: str) -> Field:
    return wire_field((list,), about)


def op_names(ops) -> list[str]:
    return sorted(str(op) for op in ops)


def check_outgoing(op: str, fields: dict[str, Any], table: Mapping[Any, Message], kind: str, declared_in: str) -> Any:
    """The declared op of ``op`` after checking ``fields`` (the sending side's checks): ProtocolError
    for an op ``table`` does not declare, or a field missing, undeclared, mistyped or out of bounds."""
    key = next((k for k in table if k == op), None)  # the member: a str equal to it finds it too
    if key is None:
        raise ProtocolError(f"cannot send {kind} op {str(op)!r}: it is not declared; declared: {op_names(table)}")
    schema = table[key].fields
    for name in fields:
        if name not in schema:
            raise ProtocolError(
                f"cannot send op {key.value!r} with field {name!r}: the op declares {sorted(schema)}; "
                f"declare the field in {declared_in}",
                field=name,
            )
    check_fields(key.value, fields, schema)
    return key


def check_fields(op: str, msg: Mapping[str, Any], schema: Mapping[str, Field]) -> None:
    """ProtocolError naming ``op`` and the field for the first field of ``schema`` that ``msg``
    lacks (unless optional) or whose value breaks a rule."""
    for name, spec in schema.items():
        if name not in msg:
            if spec.optional:
                continue
            raise ProtocolError(f"op {op!r} lacks field {name!r}", field=name)
        broken = check(msg[name], spec)
        if broken is not None:
            raise ProtocolError(f"op {op!r}: field {name!r} {_problem(broken, name, msg[name])}", field=name)


def _problem(broken: Violation, name: str, value: Any) -> str:
    spec = broken.field
    if broken.rule == "type":
        kind = " or ".join("nil" if t is NONE else t.__name__ for t in spec.types)
        return f"must be {kind}, got {type(value).__name__}"
    if broken.rule == "range":
        below = "<=" if spec.closed else "<"
        return f"= {value!r:.40} is out of range; use {spec.lo:g} <= {name} {below} {spec.hi:g}"
    if broken.rule == "length":
        return f"is {len(value)} characters long, over the limit of {spec.max_len}; send a shorter value"
    if broken.rule == "choice":
        return f"= {value!r:.40} is not one of {list(spec.choices or ())}"
    if broken.rule == "whole":
        return f"= {value!r:.40} must be a whole number"
    return f"= {value!r:.40} is not a multiple of {spec.multiple_of}"
