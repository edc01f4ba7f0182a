"""The events every benchmark uses: the demo scenario's run shape (scenarios/default.yaml), sized to N events."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from producers.scenario import Scenario, load_scenario, parse_scenario
from producers.simulator import generate
from schemas import Envelope, TopicNames
from schemas.parse import encode_event, event_key
from streams.records import Accepted, SourceRef, classify

BASE_SCENARIO = Path(__file__).resolve().parents[1] / "scenarios" / "default.yaml"
EVENTS_PER_TRAJECTORY = 4.66
"""Events per trajectory of the base scenario (queued, started, finished, verdict, snapshots, failures...)."""
BASE_DENSITY_PER_HOUR = 6000.0
"""Trajectories finishing per hour of event time in the base scenario."""


def scenario_for(events: int, *, run_id: str, start: datetime | None = None,
                 trajectories_per_hour: float = BASE_DENSITY_PER_HOUR, faults: bool = True) -> Scenario:
    """The base scenario with enough trajectories for ``events`` events at the given density."""
    base = load_scenario(BASE_SCENARIO)
    trajectories = max(50, math.ceil(events / EVENTS_PER_TRAJECTORY * 1.05))
    data: dict[str, Any] = {
        **base.model_dump(),
        "run_id": run_id,
        "trajectories": trajectories,
        "duration": max(60.0, trajectories / trajectories_per_hour * 3600.0),
    }
    if start is not None:
        data["start"] = start
    if not faults:
        data["delivery"] = {"duplicate_rate": 0.0, "late_rate": 0.0}
    return parse_scenario(data, source="bench")


def events_for(events: int, *, run_id: str, start: datetime | None = None,
               trajectories_per_hour: float = BASE_DENSITY_PER_HOUR, faults: bool = True) -> list[Envelope]:
    """Exactly ``events`` events (publish order) of the sized scenario; the last trajectories may be cut short."""
    scenario = scenario_for(events, run_id=run_id, start=start, trajectories_per_hour=trajectories_per_hour,
                            faults=faults)
    return list(itertools.islice(generate(scenario), events))


@dataclass(frozen=True, slots=True)
class Encoded:
    """Events as the wire carries them: topic, key and value bytes, in publish order."""

    topics: list[str]
    keys: list[bytes]
    values: list[bytes]

    def __len__(self) -> int:
        return len(self.values)

    @property
    def size_bytes(self) -> int:
        """Total value bytes."""
        return sum(len(v) for v in self.values)


def encode_all(events: list[Envelope], prefix: str) -> Encoded:
    """Encode events exactly as the SDK does (same JSON, same key, same topic)."""
    names = TopicNames(prefix)
    topics = [names.for_event_type(e.event_type) for e in events]  # type: ignore[attr-defined]
    keys = [event_key(e).encode() for e in events]
    values = [encode_event(e) for e in events]
    return Encoded(topics, keys, values)


def accept(encoded: Encoded, topics: TopicNames, start: int, stop: int) -> list[Accepted]:
    """Messages ``start`` to ``stop`` validated as the worker validates them (``streams.records.classify``; partition 0,
    the offset their position), the accepted ones in order; dead letters are left out."""
    accepted = []
    for offset in range(start, stop):
        item = classify(encoded.values[offset], encoded.keys[offset], SourceRef(encoded.topics[offset], 0, offset),
                        topics)
        if isinstance(item, Accepted):
            accepted.append(item)
    return accepted
