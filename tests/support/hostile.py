"""Hostile and broken messages for the raw topics, each with the outcome the platform promises for it."""

from __future__ import annotations

import json
import random
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from schemas import Envelope, TopicNames, encode_event, event_key
from schemas.parse import MAX_EVENT_BYTES

ACCEPTED = "accepted"
DUPLICATE = "duplicate"
DEAD = "dead_letter"  # any reason (random bytes)

KINDS = (
    "random_bytes", "invalid_utf8", "truncated_json", "not_an_object", "unknown_event_type",
    "future_schema_version", "missing_field", "unknown_field", "wrong_type", "far_future", "ancient",
    "naive_timestamp", "wrong_topic", "empty", "duplicate", "unknown_trajectory_verdict", "very_late",
)
RARE_KINDS = ("oversized",)  # a megabyte each: a few are enough


@dataclass(frozen=True)
class Case:
    """One message to publish and the outcome expected for it."""

    kind: str
    topic: str
    key: bytes | None
    value: bytes | None
    expected: str  # a dead-letter reason, ACCEPTED, DUPLICATE or DEAD


def _json(event: Envelope) -> dict[str, object]:
    return json.loads(encode_event(event))


def _dumps(data: object) -> bytes:
    return json.dumps(data).encode()


def make_case(rng: random.Random, kind: str, pool: list[Envelope], topics: TopicNames,
              hostile_run: str = "hostile-run") -> Case:
    """A message of ``kind`` derived from a random valid event of ``pool``."""
    event = rng.choice(pool)
    topic = topics.for_event_type(event.event_type)  # type: ignore[attr-defined]
    key = event_key(event).encode()
    data = _json(event)
    if kind == "random_bytes":
        return Case(kind, topic, key, rng.randbytes(rng.randint(1, 300)), DEAD)
    if kind == "invalid_utf8":
        raw = _dumps(data)
        cut = rng.randint(1, len(raw) - 1)
        return Case(kind, topic, key, raw[:cut] + b"\xff\xfe" + raw[cut:], "invalid_utf8")
    if kind == "truncated_json":
        raw = _dumps(data)
        return Case(kind, topic, key, raw[: rng.randint(1, len(raw) - 2)], "invalid_json")
    if kind == "not_an_object":
        return Case(kind, topic, key, _dumps(rng.choice([[1, 2], "event", 42, None, True])), "not_an_object")
    if kind == "unknown_event_type":
        data["event_type"] = rng.choice(["sandbox.teleported", "", "SANDBOX.ROLLOUT_QUEUED", "x" * 500])
        return Case(kind, topic, key, _dumps(data), "unknown_event_type")
    if kind == "future_schema_version":
        data["schema_version"] = rng.randint(3, 1000)
        return Case(kind, topic, key, _dumps(data), "unsupported_schema_version")
    if kind == "missing_field":
        required = [k for k in data if k not in ("event_type", "schema_version") and
                    k in type(event).model_fields and type(event).model_fields[k].is_required()]
        del data[rng.choice(required)]
        return Case(kind, topic, key, _dumps(data), "validation")
    if kind == "unknown_field":
        data[f"surprise_{rng.randint(0, 999)}"] = rng.choice([1, "x", None, [1], {"a": 1}])
        return Case(kind, topic, key, _dumps(data), "validation")
    if kind == "wrong_type":
        field = rng.choice([k for k in data if k not in ("event_type", "schema_version")])
        data[field] = {"not": ["a", "value"]} if not isinstance(data[field], dict) else [["nested"]]
        return Case(kind, topic, key, _dumps(data), "validation")
    if kind == "far_future":
        data["occurred_at"] = (datetime.now(UTC) + timedelta(days=rng.randint(3, 400 * 365))).isoformat()
        return Case(kind, topic, key, _dumps(data), "timestamp_out_of_range")
    if kind == "ancient":
        data["occurred_at"] = datetime(rng.randint(1, 1999), 1, 1, tzinfo=UTC).isoformat()
        return Case(kind, topic, key, _dumps(data), "timestamp_out_of_range")
    if kind == "naive_timestamp":
        data["occurred_at"] = "2026-01-01T00:00:00"
        return Case(kind, topic, key, _dumps(data), "validation")
    if kind == "wrong_topic":
        others = [t for t in topics.raw if t != topic]
        return Case(kind, rng.choice(others), key, encode_event(event), "wrong_topic")
    if kind == "empty":
        return Case(kind, topic, key, None, "empty")
    if kind == "duplicate":
        return Case(kind, topic, key, encode_event(event), DUPLICATE)
    if kind == "oversized":
        data["padding"] = "x" * (MAX_EVENT_BYTES + 10_000)
        return Case(kind, topic, key, _dumps(data), "oversized")
    # Valid events of another run: stored, and they never touch the scenario's run.
    data["run_id"] = hostile_run
    data["event_id"] = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    if kind == "unknown_trajectory_verdict":
        verdicts = [e for e in pool if e.event_type == "verifier.verification_finished"]  # type: ignore[attr-defined]
        data = _json(rng.choice(verdicts)) | {"run_id": hostile_run, "event_id": data["event_id"],
                                               "trajectory_id": f"nobody-{rng.randint(0, 10**9)}"}
        return Case(kind, TopicNames(topics.prefix).verifier, str(data["trajectory_id"]).encode(), _dumps(data),
                    ACCEPTED)
    if kind == "very_late":
        data["occurred_at"] = datetime(2001, 1, 1, tzinfo=UTC).isoformat()
        return Case(kind, topic, key, _dumps(data), ACCEPTED)
    raise ValueError(f"unknown kind {kind!r}")
