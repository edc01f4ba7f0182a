"""Small factories of valid catalog events for tests (deterministic ids and times)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from schemas import Producer, RolloutQueued
from schemas.base import Envelope

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


class Recorder:
    """An event sink for the SDK's emitters that keeps what they send, in order."""

    def __init__(self) -> None:
        self.events: list[Envelope] = []

    def send(self, event: Envelope) -> None:
        self.events.append(event)
