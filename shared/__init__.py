"""Code both sides import: errors, records, configuration, shared-memory layout, protocol."""

from .config import FILL_VALUE, AugmentConfig, StreamSettings
from .errors import (
    CapacityError,
    ConfigError,
    DaemonStopped,
    DaemonTimeout,
    DatasetError,
    ImageDecodeError,
    MissingFileError,
    PixpoolError,
    ProtocolError,
    SnapshotError,
)
from .records import Dataset, Record, Targets

__version__ = "0.1.0"

__all__ = [
    "FILL_VALUE", "AugmentConfig", "StreamSettings", "Dataset", "Record", "Targets",
    "PixpoolError", "DatasetError", "MissingFileError", "ImageDecodeError", "CapacityError",
    "SnapshotError", "ConfigError", "ProtocolError", "DaemonStopped", "DaemonTimeout",
]
