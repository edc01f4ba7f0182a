"""Errors of the streams package."""

from __future__ import annotations

from rollout.errors import PermanentError, TransientError


class SinkWriteError(TransientError):
    """A batch could not be written to ClickHouse; it is retried and its offsets are not committed."""


class ReadRejected(PermanentError):
    """A query sent to the worker's read endpoint was refused (not a read, or invalid)."""
