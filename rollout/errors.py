"""One error root for the platform; each package raises leaves of it."""

from __future__ import annotations


class RolloutError(Exception):
    """Root of every error the platform raises on purpose."""


class ConfigurationError(RolloutError):
    """A setting or argument is wrong; the message says which and how to fix it."""


class ServiceUnavailable(RolloutError):
    """A service (Kafka, ClickHouse, the worker) cannot be reached; the message says what to start."""


class TransientError(RolloutError):
    """A failure worth retrying (timeouts, a broker or server briefly away)."""


class PermanentError(RolloutError):
    """A failure that retrying will not fix (bad input, refused by the server)."""
