"""Errors of the schemas package."""

from __future__ import annotations

from rollout.errors import PermanentError


class SchemaError(PermanentError):
    """Root of the event schema errors."""


class InvalidEvent(SchemaError):
    """A payload is not a valid event; ``reason`` is a short machine-readable code, ``detail`` says more."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
