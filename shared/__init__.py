"""Code both sides import: the stream contract (configuration, RNG derivation, epoch order
and shards, HSV tables), the wire protocol, shared-memory names, segments and rings, errors.

It imports neither ``pixpool.server`` nor ``pixpool.client`` (a test walks the imports).
"""

from .errors import (
    CapacityError,
    ClosedError,
    ConfigError,
    DaemonNotFound,
    DaemonStopped,
    DaemonTimeout,
    DatasetError,
    ImageDecodeError,
    MissingExtraError,
    MissingFileError,
    NotAuthorized,
    PixpoolError,
    ProtocolError,
    RenderError,
    SnapshotError,
)
from .stream.config import FILL_VALUE, AugmentConfig, DaemonConfig, StreamSettings
from .stream.records import Dataset, Record, Targets

__version__ = "0.1.0"

__all__ = [
    "FILL_VALUE",
    "AugmentConfig",
    "DaemonConfig",
    "StreamSettings",
    "Dataset",
    "Record",
    "Targets",
    "PixpoolError",
    "DatasetError",
    "MissingFileError",
    "ImageDecodeError",
    "CapacityError",
    "SnapshotError",
    "ConfigError",
    "ProtocolError",
    "RenderError",
    "MissingExtraError",
    "DaemonStopped",
    "DaemonTimeout",
    "DaemonNotFound",
    "ClosedError",
    "NotAuthorized",
]
