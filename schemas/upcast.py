"""Upcasters: turn an older payload version into the current one on read (topics and tables are never rewritten).

Each upcaster takes the JSON object of version N and returns the object of version N+1; they are
chained until the event's current version. Stored fixtures of every old version are kept in
``tests/fixtures/events`` and tested to flow through to the same metrics.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Payload = dict[str, Any]
Upcaster = Callable[[Payload], Payload]


def _rollout_started_v1_to_v2(data: Payload) -> Payload:
    """v2 adds the scheduler pool; v1 producers ran on the one pool that existed then."""
    return {**data, "schema_version": 2, "sandbox_pool": "default"}


UPCASTERS: dict[tuple[str, int], Upcaster] = {
    ("sandbox.rollout_started", 1): _rollout_started_v1_to_v2,
}
"""(event_type, version) -> upcaster to version + 1."""


def upcast(data: Payload, current: int) -> Payload:
    """Apply upcasters until ``data`` is at ``current``; a missing step leaves it as it is (validation says why)."""
    event_type = data.get("event_type")
    version = data.get("schema_version")
    while isinstance(version, int) and version < current:
        step = UPCASTERS.get((str(event_type), version))
        if step is None:
            break
        data = step(data)
        version = data.get("schema_version")
    return data
