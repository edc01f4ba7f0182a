"""The schema's number bounds fit the tables: a trajectory with every number at its maximum is stored and
derived; one past a bound is dead-lettered (accepted, it would fail every insert of its batch and stall it)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from infra.clickhouse.client import Client
from producers.emitters import PolicyEmitter, SandboxEmitter, VerifierEmitter
from schemas import TopicNames, encode_event
from schemas.base import Envelope
from schemas.events import COUNT_MAX, UINT32_MAX
from streams.derive import DeriveConfig, Deriver
from streams.records import Accepted, DeadLetter, SourceRef, classify
from streams.sink_clickhouse import ClickHouseSink
from streams.state import OwnerState
from tests.support.events import Recorder

pytestmark = pytest.mark.integration
TOPICS = TopicNames("bounds")


def _largest_trajectory() -> list[Envelope]:
    sink = Recorder()

    def clock() -> datetime:
        return datetime(2026, 1, 1, tzinfo=UTC)

    policy = PolicyEmitter(sink, run_id="bounds", clock=clock)
    policy.run_configured(domain_weights={"code": 1.0}, staleness_bound=UINT32_MAX)
    policy.version_published(version=UINT32_MAX, checkpoint_digest="sha256:ck")
    with SandboxEmitter(sink, run_id="bounds", domain="code", task_id="t", environment_version="env-1",
                        attempt=UINT32_MAX, clock=clock) as rollout:
        rollout.started(policy_version=UINT32_MAX, sandbox_id="sb")
        for n in range(3):  # their bytes add up past 2^40 in the trajectory and its window
            rollout.snapshot(snapshot_id=f"s{n}", step=COUNT_MAX, filesystem_digest="sha256:f",
                             context_digest="sha256:c", bytes=COUNT_MAX, duration_s=1.0)
        rollout.resumed(snapshot_id="s2", steps_restored=COUNT_MAX)
        rollout.finished(termination="completed", steps=COUNT_MAX, tokens=COUNT_MAX, artifact_digest="sha256:a",
                         oldest_policy_version=UINT32_MAX, newest_policy_version=UINT32_MAX)
    VerifierEmitter(sink, run_id="bounds", verifier_id="v", verifier_version="1", clock=clock).verified(
        trajectory_id=rollout.trajectory_id, domain="code", verdict="passed", artifact_digest="sha256:a")
    policy.batch_consumed(batch_id="b", trainer_version=UINT32_MAX, trajectory_ids=[rollout.trajectory_id])
    return sink.events


def _classify(raw: bytes, event_type: str, offset: int) -> Accepted | DeadLetter:
    return classify(raw, None, SourceRef(TOPICS.for_event_type(event_type), 0, offset), TOPICS)


def test_numbers_at_their_bounds_are_stored_and_derived(engine: Client, database: str) -> None:
    events = _largest_trajectory()
    accepted = [_classify(encode_event(e), e.event_type, i) for i, e in enumerate(events)]  # type: ignore[attr-defined]
    assert all(isinstance(a, Accepted) for a in accepted)
    batch: list[Accepted] = accepted  # type: ignore[assignment]
    config = DeriveConfig()
    state = OwnerState(client=engine, database=database, window_s=config.window_s,
                       default_staleness_bound=config.default_staleness_bound)
    ClickHouseSink(client=engine, database=database, state=state).write(batch, [])
    Deriver(client=engine, database=database, config=config, state=state).derive(batch)
    row: Any = engine.query(
        f"SELECT attempt, policy_version, steps, tokens, snapshot_bytes, steps_restored FROM {database}.v_trajectories"
    ).result_rows
    assert row == [(UINT32_MAX, UINT32_MAX, COUNT_MAX, COUNT_MAX, 3 * COUNT_MAX, COUNT_MAX)]
    windows = engine.query(f"SELECT sum(snapshot_bytes) FROM {database}.v_snapshots").result_rows
    assert windows == [(3 * COUNT_MAX,)]


@pytest.mark.parametrize(("event_type", "field", "value"), [
    ("sandbox.rollout_queued", "attempt", UINT32_MAX + 1),
    ("sandbox.rollout_started", "policy_version", UINT32_MAX + 1),
    ("sandbox.rollout_finished", "newest_policy_version", UINT32_MAX + 1),
    ("sandbox.rollout_finished", "tokens", COUNT_MAX + 1),
    ("sandbox.snapshot_taken", "bytes", COUNT_MAX + 1),
    ("policy.version_published", "version", UINT32_MAX + 1),
    ("policy.run_configured", "staleness_bound", UINT32_MAX + 1),
    ("trainer.batch_consumed", "trainer_version", 2**70),
])
def test_a_number_past_its_bound_is_dead_lettered(event_type: str, field: str, value: int) -> None:
    event = next(e for e in _largest_trajectory() if e.event_type == event_type)  # type: ignore[attr-defined]
    raw = encode_event(event).replace(f'"{field}":{getattr(event, field)}'.encode(), f'"{field}":{value}'.encode())
    assert raw != encode_event(event)
    item = _classify(raw, event_type, 0)
    assert isinstance(item, DeadLetter) and item.reason == "validation" and field in item.detail
