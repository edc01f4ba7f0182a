"""The envelope every event carries, and the small value types shared by events."""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

Name = Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f]+$")]
"""An identifier: run, domain, task, trajectory, sandbox, verifier or snapshot id."""

Digest = Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9:_\-.+/=]+$")]
"""A content digest such as ``sha256:ab12…``."""

Slug = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_]*$")]
"""A lower-case code drawn from an extensible taxonomy (failure classes, reasons)."""


class Origin(StrEnum):
    """Whose fault a failure is; only ``environment`` failures lower the environment validity rate."""

    ENVIRONMENT = "environment"
    MODEL = "model"
    VERIFIER = "verifier"
    SCHEDULER = "scheduler"


class ProducerKind(StrEnum):
    """Which kind of component published an event."""

    SANDBOX = "sandbox"
    VERIFIER = "verifier"
    POLICY = "policy"
    TRAINER = "trainer"


class Frozen(BaseModel):
    """Base of every schema model: immutable, no unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid", str_strip_whitespace=False)


class Producer(Frozen):
    """Who published the event."""

    kind: ProducerKind
    id: Name
    version: Annotated[str, StringConstraints(min_length=1, max_length=100)]


class Envelope(Frozen):
    """Fields common to every event; ``event_id`` is the idempotency key."""

    event_id: UUID
    schema_version: int = Field(ge=1)
    occurred_at: datetime
    run_id: Name
    producer: Producer

    @field_validator("schema_version", mode="before")
    @classmethod
    def _integer_version(cls, value: object) -> object:
        # JSON true or 1.0 would pass as 1 (lax mode); a version is an integer literal.
        if value.__class__ is not int:
            raise ValueError(f"schema_version must be a positive integer, got {value!r}")
        return value

    @field_validator("occurred_at")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError("occurred_at needs a time zone (UTC, e.g. 2026-01-01T00:00:00Z)")
        return value.astimezone(UTC)
