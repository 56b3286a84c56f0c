"""Command-line flags generated from the configuration dataclasses' fields.

Runs in the CLI process (both sides' commands). A field ``job_timeout_s`` becomes
``--job-timeout-s`` (or the ``flag`` in its metadata), typed by its annotation, with its
help text and its default in ``--help``; a field marked ``positional`` becomes a positional
argument. ``from_args`` builds the dataclass back from the parsed namespace, so validation
happens once, in the dataclass. Each parser remembers field -> flag so that a
``ConfigError`` about a field can be printed with the flag the user typed
(``flag_names``). ``defaults_note`` says which defaults of a group are not Ultralytics'; a
help text that states its default itself gets no second one; ``add_negative_alias`` keeps an
older ``--no-X`` spelling working without listing it. ``to_argv`` is the inverse: the argument list that parses back into an equal
dataclass, so a process that starts another (a child daemon) writes no flag by hand.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from typing import Any, Iterable

from ..errors import ConfigError
from .config import field_kind

_FLAGS_ATTR = "_pixpool_flags"
_STATES_DEFAULT = re.compile(r"\bdefault\b")


def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected 0/1 or true/false, got {text!r}")


_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes from ``123``, ``512M``, ``8G``, ``1.5GiB`` (binary units: K = 1024)."""
    value = text.strip().lower().removesuffix("ib").removesuffix("b")
    unit = value[-1:] if value[-1:] in _UNITS and not value[-1:].isdigit() else ""
    number = value[: len(value) - len(unit)]
    try:
        return int(float(number) * _UNITS[unit])
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size such as 8G, 512M or 1000000 (bytes), got {text!r}") from None


def flag_of(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def add_fields(
    parser: argparse.ArgumentParser,
    cls: type,
    *,
    group: str | None = None,
    group_help: str | None = None,
    prefix: str = "",
    only: Iterable[str] | None = None,
    exclude: Iterable[str] = (),
    suppress_defaults: bool = False,
) -> None:
    """Add one argument per field of ``cls`` (dest ``prefix + name``), to a titled group if
    given; ``only``/``exclude`` choose the fields. ``suppress_defaults``: a flag not given
    leaves no attribute (``from_args`` then takes the field's default), so the caller can
    tell the flags given from the defaults."""
    target = parser.add_argument_group(group, group_help) if group else parser
    keep, skip = (set(only) if only is not None else None), set(exclude)
    known = _flag_table(parser)
    for f in dataclasses.fields(cls):
        if f.name in skip or (keep is not None and f.name not in keep) or "help" not in f.metadata:
            continue
        kind, optional = field_kind(f)
        default = f.default
        conv = (
            parse_size if f.metadata.get("size") else {"bool": parse_bool, "int": int, "float": float, "str": str}[kind]
        )
        text = f.metadata["help"]
        dest = prefix + f.name
        if f.metadata.get("positional"):
            target.add_argument(dest, metavar=f.metadata.get("metavar", f.name.upper()), type=conv, help=text)
            known[f.name] = f.metadata.get("metavar", f.name.upper())
            continue
        flag = flag_of(f)
        extra: dict[str, Any] = {}
        if kind == "bool":
            # `--keep-snapshot` alone means true; `--shuffle 0` sets false.
            extra = dict(nargs="?", const=True, metavar="BOOL")
        else:
            choices = f.metadata.get("choices")
            # Choices are checked by the dataclass (ConfigError names the field and the choices), not by argparse.
            extra = dict(metavar=f.metadata.get("metavar", "|".join(choices) if choices else kind.upper()))
        shown = "none" if default is None and optional else default
        target.add_argument(
            flag,
            dest=dest,
            type=conv,
            default=argparse.SUPPRESS if suppress_defaults else default,
            # A help text that says its default in words ("(default: beside the json)") gets no second one.
            help=text if _STATES_DEFAULT.search(text) else f"{text} (default {shown})",
            **extra,
        )
        known[f.name] = flag


def defaults_note(cls: type, differ: dict[str, tuple[Any, str]], *, exclude: Iterable[str] = ()) -> str:
    """The text under a group of flags whose defaults are Ultralytics' but for ``differ``
    (field -> (Ultralytics' default, why)); fields in ``exclude`` have no flag there."""
    skip = set(exclude)
    parts = [
        f"{flag_of(f)} {'none' if f.default is None else f.default} (Ultralytics {differ[f.name][0]}): {differ[f.name][1]}"
        for f in dataclasses.fields(cls)
        if f.name in differ and f.name not in skip
    ]
    return "Defaults are Ultralytics' (its cfg/default.yaml) except " + "; ".join(parts) + "."


def add_negative_alias(parser: argparse.ArgumentParser, flag: str, *, dest: str) -> None:
    """Accept the older spelling ``--no-X`` of ``--X 0`` without listing it: ``--help`` shows one
    way to say a bool (``--X [BOOL]``), while scripts that type ``--no-X`` keep working."""
    parser.add_argument(
        "--no-" + flag.removeprefix("--"),
        dest=dest,
        action="store_false",
        default=argparse.SUPPRESS,
        help=argparse.SUPPRESS,
    )


def from_args(cls: type, args: argparse.Namespace, *, prefix: str = "", **overrides: Any) -> Any:
    """``cls(**fields from args)``: every field that ``add_fields`` added, plus ``overrides``."""
    values = {}
    for f in dataclasses.fields(cls):
        if hasattr(args, prefix + f.name):
            values[f.name] = getattr(args, prefix + f.name)
    values.update(overrides)
    return cls(**values)


def to_argv(config: Any) -> list[str]:
    """The arguments that ``add_fields`` + ``from_args`` parse back into ``config``.

    Positionals come first, then only the fields that differ from their default: the child
    runs the same package, so its defaults are these. Bools are written ``--flag 0/1``, sizes
    as bytes, floats by ``repr`` (exact); a nested dataclass field (``StreamSettings.augment``)
    contributes its own fields' flags. ConfigError for a value no flag can express (a field
    without a flag that differs from its default, None where the default is not None, a
    positional that argparse would read as a flag)."""
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        raise TypeError(f"to_argv takes a configuration dataclass instance, got {type(config).__name__}")
    positionals: list[str] = []
    options: list[str] = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.metadata.get("positional"):
            text = _arg_text(f, value)
            if text.startswith("-"):
                raise ConfigError.for_field(
                    f.name, value, "starts with '-', which the command line reads as a flag; give it as ./" + text
                )
            positionals.append(text)
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        if value == default:
            continue
        if dataclasses.is_dataclass(value):
            options += to_argv(value)
        elif "help" not in f.metadata:
            raise ConfigError.for_field(f.name, value, "has no command-line flag; leave it at its default")
        elif value is None:
            raise ConfigError.for_field(f.name, value, f"has no command-line form (the default is {default!r})")
        else:
            options += [flag_of(f), _arg_text(f, value)]
    return positionals + options


def _arg_text(f: dataclasses.Field, value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return repr(value)  # round-trips exactly through float()
    return str(value)


def flag_names(parser: argparse.ArgumentParser) -> dict[str, str]:
    """field name -> flag, for every field the parser's flags set."""
    return dict(getattr(parser, _FLAGS_ATTR, {}))


def _flag_table(parser: argparse.ArgumentParser) -> dict[str, str]:
    table = getattr(parser, _FLAGS_ATTR, None)
    if table is None:
        table = {}
        setattr(parser, _FLAGS_ATTR, table)
    return table
