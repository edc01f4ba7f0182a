"""The event catalog: frozen pydantic models of what happened in sandboxes, verifiers and trainers."""

from schemas.base import Envelope, Origin, Producer, ProducerKind
from schemas.events import (
    EVENT_TYPES,
    BatchConsumed,
    EnvironmentFailed,
    Event,
    PolicyVersionPublished,
    RolloutFinished,
    RolloutInterrupted,
    RolloutQueued,
    RolloutResumed,
    RolloutStarted,
    RunConfigured,
    SnapshotTaken,
    VerificationCheck,
    VerificationFinished,
)
from schemas.exceptions import InvalidEvent, SchemaError
from schemas.parse import decode_event, encode_event, event_key
from schemas.topics import TopicNames

__all__ = [
    "EVENT_TYPES",
    "BatchConsumed",
    "Envelope",
    "EnvironmentFailed",
    "Event",
    "InvalidEvent",
    "Origin",
    "PolicyVersionPublished",
    "Producer",
    "ProducerKind",
    "RolloutFinished",
    "RolloutInterrupted",
    "RolloutQueued",
    "RolloutResumed",
    "RolloutStarted",
    "RunConfigured",
    "SchemaError",
    "SnapshotTaken",
    "TopicNames",
    "VerificationCheck",
    "VerificationFinished",
    "decode_event",
    "encode_event",
    "event_key",
]
