"""``ClientOptions``: how a trainer reaches its daemon and takes its batches, as one value.

Runs in the trainer process. ``attach()`` keeps its keywords (``socket_dir=``, ``timeout_s=``,
...) as its public spelling and turns them into one ``ClientOptions`` at its edge; ``Client``,
``Loader``, ``fit``, the validation passes (``pass_stream.py``) and ``pixpool digest`` take the
value. It is checked once, where it is made: each field's rules are a ``shared.schema.Field``
declared beside it (``schema.declare``), as ``FitConfig``'s are (``train/fit_config.py``, which
words its refusals with its flags); a value that breaks one is a ``ConfigError`` naming the field.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from ..shared import schema
from ..shared.errors import ConfigError
from ..shared.schema import declare, first_broken
from ..shared.stream.served_data import ExpectedData
from ..shared.transport.ring import DEFAULT_SLOTS
from ..shared.wire.trainer import DELIVERY_FRAMES
from .delivery import delivery_for

__all__ = ["ClientOptions"]


_SECONDS = schema.Field((int, float), about="a number of seconds >= 0 (0: fail at once)", lo=0.0, closed=True)


@dataclass(frozen=True)
class ClientOptions:
    """The options of one attachment (the module docstring says where they are checked).

    Where the daemon is: ``socket_dir`` (its ipc socket's directory; None: the default one) or
    ``endpoint`` (``tcp://HOST:PORT``, which needs ``keys_dir``, the CURVE keys of
    ``pixpool keys``). ``timeout_s``: how long the daemon has to answer (and, once attached, to
    come back after a restart); ``wait_s``: how long to wait for a daemon not started yet.
    ``slots``: ring slots. ``store``: where this process sees the daemon's store, where that
    differs from the daemon's path (a container). ``expect``: the data the trainer names
    (``served_data.expect``). ``follow_snapshot``: go on with a restarted daemon's other
    snapshot instead of stopping.

    How batches are handed out (``client.py``): ``as_torch`` (None: torch where a device is
    given or HSV runs on it), ``device``, ``zero_copy`` (views of the ring slot, this low-level
    API's default; ``attach()`` defaults to False), ``lend``. ``heartbeat_interval_s``,
    ``fetch_files`` (every record's file name at each attach) and ``timings`` (a dict that
    accumulates delivery times) are for tests and benchmarks."""

    socket_dir: str | os.PathLike | None = None
    endpoint: str | None = None
    keys_dir: str | os.PathLike | None = None
    timeout_s: float = 60.0
    wait_s: float = declare(0.0, rules=_SECONDS)
    slots: int = DEFAULT_SLOTS
    store: str | os.PathLike | None = None
    expect: ExpectedData | None = declare(
        None,
        rules=schema.Field((ExpectedData, schema.NONE), about="a served_data.ExpectedData (served_data.expect(PATH))"),
    )
    follow_snapshot: bool = False
    as_torch: bool | None = None
    device: Any = None
    zero_copy: bool = True
    lend: bool = True
    heartbeat_interval_s: float = 1.0
    fetch_files: bool = False
    timings: dict | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self) -> None:
        broken = first_broken(self)
        if broken is not None:
            name, value, violation = broken
            if violation.rule == "type" and name == "expect":
                raise TypeError(f"{name} must be {violation.field.about}, got {type(value).__name__}")
            raise ConfigError.for_field(name, value, f"must be {violation.field.about}")
        object.__setattr__(self, "timeout_s", float(self.timeout_s))
        object.__setattr__(self, "wait_s", float(self.wait_s))
        if self.remote and self.keys_dir is None:
            raise ConfigError(
                f"{self.endpoint}: TCP needs CURVE keys; pass keys_dir (made by `pixpool keys DIR`)", field="keys_dir"
            )

    @property
    def remote(self) -> bool:
        """Over TCP: batches come as frames, not through a mapped ring (``delivery.py``)."""
        return bool(self.endpoint) and delivery_for(self.endpoint) == DELIVERY_FRAMES

    def replace(self, **changes: Any) -> "ClientOptions":
        """These options with ``changes``, checked again."""
        return dataclasses.replace(self, **changes)
