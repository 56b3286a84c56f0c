"""Code both sides import: errors, records, configuration, shared-memory layout, protocol."""

__version__ = "0.1.0"
