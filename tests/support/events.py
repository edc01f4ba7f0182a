"""Small factories of valid catalog events for tests (deterministic ids and times)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from schemas import Producer, RolloutQueued

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
