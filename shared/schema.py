"""One declaration-driven validator, for the wire's messages and for the settings.

Code both sides import. A ``Field`` declares what one value may be: its types, a numeric range
(``lo`` .. ``hi``: half-open as the wire's bounds are, or ``closed`` as a setting's are), whole
numbers only, a step (``multiple_of``), a longest string (``max_len``), a few allowed values
(``choices``), and whether it may be left out. A ``Message`` groups the fields of one wire
operation.

``check`` finds the first rule a value breaks and returns it as a ``Violation``; it raises
nothing and words nothing, because each side says it in its own terms: the wire
(``pixpool.shared.wire``) as a ``ProtocolError`` naming the op and field, the settings
(``pixpool.shared.stream.config``) as a ``ConfigError`` naming the field (and, on a command
line, its flag). msgpack stays the wire format: this module checks decoded values and packs
nothing. ``declare`` puts a ``Field`` beside a dataclass field, and ``first_broken`` finds the
first field of such a dataclass that breaks its rules (``ClientOptions``, ``FitConfig``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

__all__ = ["NONE", "RULES", "Field", "Message", "Violation", "check", "declare", "first_broken"]

NONE = type(None)  # a type a field may name: msgpack's nil
# The rules ``check`` applies, in the order it applies them.
RULES = ("type", "whole", "range", "multiple", "length", "choice")


@dataclass(frozen=True)
class Field:
    """What one value means (``about``) and may hold.

    ``types`` empty admits any type (a setting's annotation gives it where it is checked); a
    bool is an ``int`` to Python but passes only where ``bool`` is named. The numeric rules
    (``whole``, ``lo``/``hi``/``closed``, ``multiple_of``) apply to numbers, never to bools;
    ``max_len`` to strings; ``choices`` to any value. ``optional``: a message may leave it out."""

    types: tuple[type, ...] = ()
    about: str = ""
    lo: float = -math.inf
    hi: float = math.inf
    closed: bool = False
    whole: bool = False
    multiple_of: int | None = None
    max_len: int | None = None
    choices: tuple[Any, ...] | None = None
    optional: bool = False


@dataclass(frozen=True)
class Message:
    """One wire operation in one direction: what it means and its fields (name -> ``Field``)."""

    about: str
    fields: Mapping[str, Field] = field(default_factory=dict)


@dataclass(frozen=True)
class Violation:
    """The rule (one of ``RULES``) a value broke, and the ``Field`` that declares its bounds."""

    rule: str
    field: Field


def check(value: Any, spec: Field) -> Violation | None:
    """The first rule of ``spec`` that ``value`` breaks, or None where it keeps them all."""
    if spec.types and (not isinstance(value, spec.types) or (isinstance(value, bool) and bool not in spec.types)):
        return Violation("type", spec)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if spec.whole and not float(value).is_integer():
            return Violation("whole", spec)
        # NaN is inside no range: every comparison with it is false.
        if not (spec.lo <= value <= spec.hi if spec.closed else spec.lo <= value < spec.hi):
            return Violation("range", spec)
        if spec.multiple_of is not None and value % spec.multiple_of:
            return Violation("multiple", spec)
    if isinstance(value, str) and spec.max_len is not None and len(value) > spec.max_len:
        return Violation("length", spec)
    if spec.choices is not None and value not in spec.choices:
        return Violation("choice", spec)
    return None


def declare(default: Any, help: str = "", rules: Field | None = None, **metadata: Any) -> Any:
    """A dataclass field with its ``help`` text and its ``rules`` (a ``Field``) in its
    metadata, beside the rest of ``metadata`` (a flag, choices to show, ...)."""
    if rules is not None:
        metadata["rules"] = rules
    return dataclasses.field(default=default, metadata={"help": help, **metadata} if help else metadata)


def first_broken(obj: Any) -> tuple[str, Any, Violation] | None:
    """(name, value, violation) of the first field of the dataclass ``obj``, in declaration
    order, whose value breaks its declared rules; None where every one keeps them."""
    for f in dataclasses.fields(obj):
        rules = f.metadata.get("rules")
        if rules is None:
            continue
        value = getattr(obj, f.name)
        broken = check(value, rules)
        if broken is not None:
            return f.name, value, broken
    return None
