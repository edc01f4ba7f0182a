"""Small factories of valid catalog events for tests (deterministic ids and times)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from bench.workload import accept, encode_all
from schemas import Producer, RolloutQueued, TopicNames
from schemas.base import Envelope
from streams.records import Accepted

BASE_TIME = datetime(2026, 1, 1, tzinfo=UTC)


def queued(i: int, *, run_id: str = "run-test", domain: str = "code") -> RolloutQueued:
    """A rollout_queued event whose id and time follow from ``i``."""
    return RolloutQueued(
        event_id=uuid.UUID(int=i + 1, version=4),
        occurred_at=BASE_TIME + timedelta(seconds=i),
        run_id=run_id,
        producer=Producer(kind="sandbox", id="sb-test", version="1"),
        trajectory_id=f"traj-{i}",
        domain=domain,
        task_id=f"task-{i % 7}",
        environment_version="env-1",
    )


def accept_all(events: Iterable[Envelope], topics: TopicNames) -> list[Accepted]:
    """Each event as the worker accepts it off its own topic (``bench.workload.accept``: partition 0, offsets in
    order); any refusal fails."""
    encoded = encode_all(list(events), topics.prefix)
    out = accept(encoded, topics, 0, len(encoded))
    accepted = {item.source.offset for item in out}
    refused = [offset for offset in range(len(encoded)) if offset not in accepted]
    assert not refused, f"refused at offsets {refused[:10]}: {encoded.values[refused[0]][:300]!r}"
    return out


class Recorder:
    """An event sink for the SDK's emitters that keeps what they send, in order."""

    def __init__(self) -> None:
        self.events: list[Envelope] = []

    def send(self, event: Envelope) -> None:
        self.events.append(event)
