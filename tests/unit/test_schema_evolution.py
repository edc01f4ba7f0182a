"""Schema evolution: stored version-1 payloads are upcast on read and give the same records and metrics."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from schemas import InvalidEvent, Producer, RolloutFinished, RolloutQueued, RolloutStarted, decode_event, encode_event
from schemas.events import Verdict, VerificationFinished
from streams.metrics import throughput_row
from streams.trajectory import AssemblyConfig, VersionTimeline, assemble

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "events"


def test_every_upcaster_has_a_stored_old_payload() -> None:
    from schemas.upcast import UPCASTERS

    for event_type, version in UPCASTERS:
        assert (FIXTURES / f"v{version}" / f"{event_type}.json").is_file(), (event_type, version)


def test_a_stored_v1_rollout_started_is_read_as_v2() -> None:
    raw = (FIXTURES / "v1" / "sandbox.rollout_started.json").read_bytes()
    event = decode_event(raw)
    assert isinstance(event, RolloutStarted)
    assert event.schema_version == 2
    assert event.sandbox_pool == "default"
    original = json.loads(raw)
    assert (str(event.event_id), event.sandbox_id, event.policy_version) == (
        original["event_id"], original["sandbox_id"], original["policy_version"])


def test_v2_requires_the_new_field_and_newer_versions_are_refused() -> None:
    data = json.loads((FIXTURES / "v1" / "sandbox.rollout_started.json").read_text())
    with pytest.raises(InvalidEvent) as missing:
        decode_event({**data, "schema_version": 2})
    assert missing.value.reason == "validation" and "sandbox_pool" in missing.value.detail
    with pytest.raises(InvalidEvent) as newer:
        decode_event({**data, "schema_version": 3, "sandbox_pool": "p"})
    assert newer.value.reason == "unsupported_schema_version"


def test_v1_and_v2_trajectories_give_the_same_record_and_metrics() -> None:
    started_v1 = decode_event((FIXTURES / "v1" / "sandbox.rollout_started.json").read_bytes())
    base = {"run_id": "run-v1", "trajectory_id": "traj-v1", "domain": "code"}
    sandbox = Producer(kind="sandbox", id="sandbox-legacy", version="0.9.0")
    t0 = started_v1.occurred_at
    queued = RolloutQueued(event_id=uuid.UUID(int=1, version=4), occurred_at=t0 - timedelta(seconds=4),
                           producer=sandbox, task_id="task", environment_version="env-1", **base)
    finished = RolloutFinished(event_id=uuid.UUID(int=2, version=4), occurred_at=t0 + timedelta(seconds=60),
                               producer=sandbox, termination="completed", steps=10, tokens=100,
                               artifact_digest="sha256:aa", oldest_policy_version=3, newest_policy_version=3, **base)
    verdict = VerificationFinished(event_id=uuid.UUID(int=3, version=4), occurred_at=t0 + timedelta(seconds=70),
                                   producer=Producer(kind="verifier", id="v", version="1"), verifier_id="v",
                                   verifier_version="1", verdict=Verdict.PASSED, artifact_digest="sha256:aa", **base)
    started_v2 = decode_event(encode_event(RolloutStarted(
        event_id=started_v1.event_id, occurred_at=t0, producer=sandbox, policy_version=3,
        sandbox_id="sb-legacy-7", sandbox_pool="default", **base)))
    timeline, config = VersionTimeline(), AssemblyConfig()
    old = assemble([queued, started_v1, finished, verdict], timeline, config)
    new = assemble([queued, started_v2, finished, verdict], timeline, config)
    assert old is not None and old == new
    window = {"run_id": "run-v1", "domain": "code", "window_start": None, "window_end": None}
    assert throughput_row(window, [old]) == throughput_row(window, [new])
    assert old.decided and old.passed
