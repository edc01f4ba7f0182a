"""The traffic simulator: exact allocation, determinism, event validity and ordering, publishing."""

from __future__ import annotations

import sys
import time
import types
from bisect import bisect_right
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from fractions import Fraction
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import typer
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from producers.scenario import Scenario, load_scenario, parse_scenario
from producers.simulator import (
    ExpectedCounts,
    PublishReport,
    expected_counts,
    generate,
    largest_remainder,
    publish,
)
from rollout.commands import simulate as simulate_command
from schemas.base import Envelope, Origin
from schemas.events import (
    BatchConsumed,
    EnvironmentFailed,
    PolicyVersionPublished,
    RolloutFinished,
    RolloutInterrupted,
    RolloutQueued,
    RolloutResumed,
    RolloutStarted,
    RunConfigured,
    SnapshotTaken,
    Termination,
    Verdict,
    VerificationFinished,
)
from schemas.parse import decode_event, encode_event

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
EXACT_SCENARIOS = ("golden.yaml", "regression.yaml", "healthy.yaml", "default.yaml")


@cache
def _scenario(name: str) -> Scenario:
    return load_scenario(SCENARIOS / name)


@cache
def _events(name: str) -> tuple[Envelope, ...]:
    return tuple(generate(_scenario(name)))


def _small(**changes: Any) -> Scenario:
    """A small scenario with every optional feature on."""
    data: dict[str, Any] = {
        "run_id": "small",
        "seed": 5,
        "start": "2026-03-01T12:00:00Z",
        "duration": "20m",
        "trajectories": 400,
        "policy": {"versions": 4, "async_lag": [0, 2]},
        "staleness_bound": 1,
        "training": {"batch_size": 32, "delay": "10s"},
        "domains": [
            {
                "name": "code",
                "weight": 3,
                "run_time": ["20s", "3m"],
                "wait_time": ["1s", "30s"],
                "env_failure_rate": 0.2,
                "env_failure_classes": {"dependency_unreachable": 1, "timeout": 1},
                "undecidable_rate": 0.1,
                "digest_mismatch_rate": 0.1,
                "model_error_rate": 0.3,
                "pass_rate": 0.5,
                "pass_rate_by_version": {4: 0.2},
                "snapshot_rate": 0.5,
                "snapshots_per_trajectory": [1, 4],
                "interrupt_rate": 0.3,
                "interrupt_reasons": {"preempted": 1, "stale_policy": 1},
                "resume_failure_rate": 0.3,
            },
            {
                "name": "math",
                "weight": 1,
                "run_time": ["5s", "1m"],
                "wait_time": "2s",
                "pass_rate": 0.7,
            },
        ],
    }
    data.update(changes)
    return parse_scenario(data)


# -- a reference reading of the metric definitions (DESIGN.md), applied to generated events ----


@dataclass
class _Trajectory:
    events: list[Envelope] = field(default_factory=list)

    def one(self, kind: type[Envelope]) -> Any:
        found = [e for e in self.events if isinstance(e, kind)]
        assert len(found) == 1, f"{kind.__name__}: {len(found)}"
        return found[0]

    def all(self, kind: type[Envelope]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


def _unique(events: Iterable[Envelope]) -> list[Envelope]:
    seen: dict[Any, Envelope] = {}
    for event in events:
        seen.setdefault(event.event_id, event)
    return list(seen.values())


def _trajectories(events: Iterable[Envelope]) -> dict[str, _Trajectory]:
    found: dict[str, _Trajectory] = defaultdict(_Trajectory)
    for event in _unique(events):
        trajectory_id = getattr(event, "trajectory_id", None)
        if trajectory_id is not None:
            found[trajectory_id].events.append(event)
    return found


def _publications(events: Iterable[Envelope]) -> list[datetime]:
    versions = sorted((e.version, e.occurred_at) for e in events if isinstance(e, PolicyVersionPublished))
    assert [v for v, _ in versions] == list(range(1, len(versions) + 1))
    return [t for _, t in versions]


def _observed(events: Iterable[Envelope]) -> dict[str, Any]:
    """Counts per domain and per domain × version, derived from events as the metric definitions say."""
    events = list(events)
    published = _publications(events)
    counts: dict[str, Any] = {}
    for trajectory in _trajectories(events).values():
        finished: RolloutFinished = trajectory.one(RolloutFinished)
        started: RolloutStarted = trajectory.one(RolloutStarted)
        version = started.policy_version
        failures = [f for f in trajectory.all(EnvironmentFailed) if f.origin is Origin.ENVIRONMENT]
        model = [f for f in trajectory.all(EnvironmentFailed) if f.origin is Origin.MODEL]
        verdicts = trajectory.all(VerificationFinished)
        domain = counts.setdefault(finished.domain, {"by_version": {}, "lag_versions": Counter()})
        newest = bisect_right(published, finished.occurred_at)
        domain["lag_versions"][newest - finished.oldest_policy_version] += 1
        for bucket in (domain, domain["by_version"].setdefault(version, {})):
            add = Counter[str]()
            add["finished"] += 1
            if failures:
                add["env_failed"] += 1
                bucket.setdefault("env_failures", Counter())[failures[0].failure_class] += 1
                assert not verdicts
            else:
                add["env_valid"] += 1
                (verdict,) = verdicts
                matches = verdict.artifact_digest == finished.artifact_digest
                if verdict.verdict in (Verdict.PASSED, Verdict.FAILED) and matches:
                    add["decided"] += 1
                    add["passed" if verdict.verdict is Verdict.PASSED else "failed"] += 1
                    add["model_errors"] += bool(model)
                elif verdict.verdict is Verdict.UNDECIDABLE:
                    add["undecidable"] += 1
                else:
                    add["digest_mismatch"] += 1
            for key, value in add.items():
                bucket[key] = bucket.get(key, 0) + value
    return counts


def _assert_matches(observed: dict[str, Any], expected: ExpectedCounts) -> None:
    keys = ("finished", "env_valid", "env_failed", "undecidable", "digest_mismatch", "decided", "passed")
    keys += ("failed", "model_errors")
    assert set(observed) == {name for name, c in expected["domains"].items() if c["finished"]}
    for name, want in expected["domains"].items():
        if not want["finished"]:
            assert want["by_version"] == {} and want["lag_versions"] == {}
            continue
        got = observed[name]
        assert {k: got.get(k, 0) for k in keys} == {k: want[k] for k in keys}, name  # type: ignore[literal-required]
        assert dict(got.get("env_failures", {})) == want["env_failures"], name
        assert dict(got["lag_versions"]) == want["lag_versions"], name
        assert set(got["by_version"]) == set(want["by_version"]), name
        for version, cell in want["by_version"].items():
            seen = got["by_version"][version]
            assert {k: seen.get(k, 0) for k in keys} == {k: cell[k] for k in keys}, (name, version)  # type: ignore[literal-required]
            assert dict(seen.get("env_failures", {})) == cell["env_failures"], (name, version)


# -- largest remainder -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("total", "weights", "parts"),
    [
        (10, [1, 1, 1], [4, 3, 3]),  # equal remainders: earlier first
        (10, [1, 1, 1, 1], [3, 3, 2, 2]),
        (7, [0.5, 0.5], [4, 3]),
        (1000, [0.5, 0.3, 0.2], [500, 300, 200]),
        (10, [0.35, 0.65], [4, 6]),  # 3.5/6.5 is a tie only in exact decimals; floats would say [3, 7]
        (100, [0.29, 0.71], [29, 71]),
        (5, [0, 1, 0], [0, 5, 0]),
        (0, [1, 2], [0, 0]),
        (0, [0, 0], [0, 0]),
        (3, [Fraction(1, 3)] * 3, [1, 1, 1]),
        (30, [2, 1, 1], [15, 8, 7]),
        (24, [0.2, 0.8], [5, 19]),  # 4.8 / 19.2
        (1, [0.2, 0.3, 0.5], [0, 0, 1]),
        (2, [0.2, 0.3, 0.5], [0, 1, 1]),
    ],
)
def test_largest_remainder(total: int, weights: list[Any], parts: list[int]) -> None:
    assert largest_remainder(total, weights) == parts


def test_largest_remainder_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        largest_remainder(-1, [1])
    with pytest.raises(ValueError):
        largest_remainder(3, [0, 0])
    with pytest.raises(ValueError):
        largest_remainder(3, [1, -1])


@given(
    total=st.integers(min_value=0, max_value=10_000),
    weights=st.lists(st.integers(min_value=0, max_value=1000), min_size=1, max_size=8).filter(any),
)
def test_largest_remainder_is_hamilton(total: int, weights: list[int]) -> None:
    parts = largest_remainder(total, weights)
    quotas = [Fraction(total * w, sum(weights)) for w in weights]
    assert sum(parts) == total
    assert all(q - 1 < p < q + 1 for p, q in zip(parts, quotas, strict=True))
    # Only the largest fractional parts (earlier first on ties) were rounded up.
    up = [i for i, (p, q) in enumerate(zip(parts, quotas, strict=True)) if p > q]
    down = [i for i, (p, q) in enumerate(zip(parts, quotas, strict=True)) if p < q or (p == q and q % 1 == 0)]
    for i in up:
        for j in down:
            fi, fj = quotas[i] % 1, quotas[j] % 1
            assert fi > fj or (fi == fj and i < j)


# -- exact allocation --------------------------------------------------------------------------


def test_golden_counts_by_hand() -> None:
    counts = expected_counts(_scenario("golden.yaml"))
    code, math, documents = (counts["domains"][n] for n in ("code", "math", "documents"))
    assert [code["by_version"][v]["finished"] for v in range(1, 6)] == [150, 100, 100, 100, 50]
    assert [math["by_version"][v]["finished"] for v in range(1, 6)] == [90, 60, 60, 60, 30]
    assert [documents["by_version"][v]["finished"] for v in range(1, 6)] == [60, 40, 40, 40, 20]
    assert code["lag_versions"] == {0: 300, 1: 200}

    assert (code["finished"], code["env_failed"], code["env_valid"]) == (500, 100, 400)
    assert code["env_failures"] == {"dependency_unreachable": 60, "license_prompt": 20, "data_missing": 20}
    assert (code["undecidable"], code["decided"], code["passed"], code["failed"]) == (100, 300, 141, 159)
    assert code["model_errors"] == 32
    assert [code["by_version"][v]["passed"] for v in range(1, 6)] == [45, 30, 30, 30, 6]
    assert code["by_version"][5]["model_errors"] == 5  # 24 failed × 0.2 = 4.8 -> 5

    assert (math["finished"], math["env_failed"], math["decided"], math["passed"], math["failed"]) == (
        300,
        30,
        270,
        200,
        70,
    )
    assert [math["by_version"][v]["passed"] for v in range(1, 6)] == [57, 38, 38, 43, 24]

    assert documents["env_failures"] == {"license_prompt": 20, "data_missing": 20}
    assert (documents["undecidable"], documents["digest_mismatch"], documents["decided"]) == (40, 20, 100)
    assert (documents["passed"], documents["failed"]) == (60, 40)

    total = counts["total"]
    assert (total["finished"], total["env_valid"], total["decided"], total["passed"]) == (1000, 830, 670, 401)


def test_golden_events_by_hand() -> None:
    by_type = Counter(e.event_type for e in _events("golden.yaml"))  # type: ignore[attr-defined]
    assert by_type == {
        "policy.run_configured": 1,
        "policy.version_published": 5,
        "sandbox.rollout_queued": 1000,
        "sandbox.rollout_started": 1000,
        "sandbox.rollout_finished": 1000,
        "sandbox.environment_failed": 170 + 32,
        "verifier.verification_finished": 830,
        "trainer.batch_consumed": 7,
    }


@pytest.mark.parametrize("name", EXACT_SCENARIOS)
def test_generated_events_match_expected_counts(name: str) -> None:
    _assert_matches(_observed(_events(name)), expected_counts(_scenario(name)))


@pytest.mark.parametrize("seed", [1, 2])
def test_small_scenario_matches_expected_counts(seed: int) -> None:
    scenario = _small(seed=seed)
    _assert_matches(_observed(generate(scenario)), expected_counts(scenario))


@pytest.mark.parametrize(
    ("trajectories", "versions", "lag", "minutes"),
    [(7, 3, [0, 0], 60), (13, 4, [1, 3], 7), (1, 1, [0, 2], 1), (97, 6, [0, 5], 61), (50, 10, [2, 2], 30)],
)
def test_exact_plan_agrees_with_the_generator_on_awkward_numbers(
    trajectories: int, versions: int, lag: list[int], minutes: int
) -> None:
    domains = [d.model_dump() for d in _small().domains]
    domains[0]["pass_rate_by_version"] = {1: 0.2}
    scenario = _small(
        trajectories=trajectories,
        duration=f"{minutes}m",
        policy={"versions": versions, "async_lag": lag},
        domains=domains,
    )
    expected = expected_counts(scenario)
    assert sum(c["finished"] for c in expected["domains"].values()) == trajectories
    _assert_matches(_observed(generate(scenario)), expected)


def test_counts_do_not_depend_on_the_seed() -> None:
    assert expected_counts(_small(seed=1)) == expected_counts(_small(seed=2))


def test_domain_split_is_largest_remainder_over_weights() -> None:
    counts = expected_counts(_small(trajectories=401))
    assert [c["finished"] for c in counts["domains"].values()] == largest_remainder(401, [3, 1])


def test_exact_finish_times_are_evenly_spread() -> None:
    scenario = _small(trajectories=40, training=None, domains=[_small().domains[1].model_dump()])
    finishes = [e.occurred_at for e in generate(scenario) if isinstance(e, RolloutFinished)]
    gaps = {b - a for a, b in zip(finishes, finishes[1:], strict=False)}
    assert gaps == {timedelta(seconds=30)}
    assert finishes[0] == scenario.start + timedelta(seconds=15)


# -- determinism and validity ------------------------------------------------------------------


def test_generation_is_deterministic() -> None:
    first = [encode_event(e) for e in generate(_small())]
    second = [encode_event(e) for e in generate(_small())]
    assert first == second


def test_another_seed_gives_other_events() -> None:
    first = list(generate(_small(seed=1)))
    second = list(generate(_small(seed=2)))
    assert {e.event_id for e in first}.isdisjoint(e.event_id for e in second)
    ids = {getattr(e, "trajectory_id", None) for e in first} - {None}
    assert ids.isdisjoint(getattr(e, "trajectory_id", None) for e in second)


@pytest.mark.parametrize("name", [*EXACT_SCENARIOS, "small"])
def test_every_event_survives_the_wire(name: str) -> None:
    events = list(generate(_small())) if name == "small" else _events(name)
    for event in events:
        assert decode_event(encode_event(event)) == event


def test_events_are_in_event_time_order_without_delivery_faults() -> None:
    for events in (_events("golden.yaml"), _events("regression.yaml"), tuple(generate(_small()))):
        times = [e.occurred_at for e in events]
        assert times == sorted(times)
        assert isinstance(events[0], RunConfigured)
        assert isinstance(events[1], PolicyVersionPublished) and events[1].version == 1


def test_run_configuration() -> None:
    scenario = _small()
    run = next(iter(generate(scenario)))
    assert isinstance(run, RunConfigured)
    assert run.domain_weights == {"code": 0.75, "math": 0.25}
    assert run.staleness_bound == 1
    assert run.occurred_at == scenario.start


def test_versions_are_published_evenly() -> None:
    scenario = _small()
    published = _publications(generate(scenario))
    assert published == [scenario.start + timedelta(minutes=5 * i) for i in range(4)]


@pytest.mark.parametrize("scenario", [_small(), _small(allocation="sample"), _scenario("default.yaml")])
def test_timelines_versions_and_lags_are_consistent(scenario: Scenario) -> None:
    events = list(generate(scenario))
    published = _publications(events)
    low, high = scenario.policy.async_lag
    for trajectory in _trajectories(events).values():
        queued: RolloutQueued = trajectory.one(RolloutQueued)
        started: RolloutStarted = trajectory.one(RolloutStarted)
        finished: RolloutFinished = trajectory.one(RolloutFinished)
        version = started.policy_version
        assert 1 <= version <= scenario.policy.versions
        assert finished.oldest_policy_version == version <= finished.newest_policy_version
        assert scenario.start <= queued.occurred_at <= started.occurred_at <= finished.occurred_at
        assert started.occurred_at >= published[version - 1], "started before its version was published"
        assert scenario.start <= finished.occurred_at < scenario.end
        newest = bisect_right(published, finished.occurred_at)
        assert finished.newest_policy_version <= newest
        lag = newest - version
        assert lag <= high
        assert lag >= low or version == 1
        newest_at_start = bisect_right(published, started.occurred_at)
        assert 0 <= newest_at_start - version <= high
        for event in trajectory.events:
            assert event.run_id == scenario.run_id
            assert started.occurred_at <= event.occurred_at or event is queued
        for verdict in trajectory.all(VerificationFinished):
            assert verdict.occurred_at > finished.occurred_at


def test_outcome_shapes() -> None:
    events = list(generate(_small()))
    seen: Counter[str] = Counter()
    for trajectory in _trajectories(events).values():
        finished: RolloutFinished = trajectory.one(RolloutFinished)
        failures = trajectory.all(EnvironmentFailed)
        verdicts = trajectory.all(VerificationFinished)
        if failures and failures[0].origin is Origin.ENVIRONMENT:
            seen["environment"] += 1
            assert finished.termination is Termination.ENVIRONMENT_FAILURE
            assert finished.artifact_digest is None and not verdicts
            assert failures[0].failure_class in {"dependency_unreachable", "timeout"}
            continue
        (verdict,) = verdicts
        if failures:
            seen["model"] += 1
            assert failures[0].origin is Origin.MODEL and failures[0].failure_class == "invalid_tool_call"
            assert finished.termination is Termination.AGENT_ERROR
            assert verdict.verdict is Verdict.FAILED and verdict.artifact_digest == finished.artifact_digest
        elif verdict.artifact_digest != finished.artifact_digest:
            seen["mismatch"] += 1
            assert verdict.verdict in (Verdict.PASSED, Verdict.FAILED)
        assert finished.artifact_digest is not None and finished.artifact_digest.startswith("sha256:")
        assert len(finished.artifact_digest) == len("sha256:") + 64
        if verdict.verdict is Verdict.PASSED:
            assert verdict.reward == 1.0 and all(check.passed for check in verdict.checks)
        elif verdict.verdict is Verdict.FAILED:
            assert verdict.reward == 0.0
        else:
            assert verdict.reward is None
        assert verdict.verifier_version == "v1"
    assert seen["environment"] and seen["model"] and seen["mismatch"]


def test_snapshots_interruptions_and_resumes() -> None:
    events = list(generate(_small()))
    interrupted = 0
    for trajectory in _trajectories(events).values():
        snapshots: list[SnapshotTaken] = trajectory.all(SnapshotTaken)
        interruptions: list[RolloutInterrupted] = trajectory.all(RolloutInterrupted)
        resumes: list[RolloutResumed] = trajectory.all(RolloutResumed)
        assert len(interruptions) == len(resumes) <= 1
        steps = [s.step for s in snapshots]
        assert steps == sorted(steps)
        if not interruptions:
            continue
        interrupted += 1
        (stop,), (resume,) = interruptions, resumes
        taken = {s.snapshot_id: s for s in snapshots}
        assert resume.snapshot_id in taken
        snapshot = taken[resume.snapshot_id]
        assert snapshot.occurred_at <= stop.occurred_at <= resume.occurred_at
        assert resume.steps_restored == (snapshot.step if resume.succeeded else 0)
        later = [s for s in snapshots if s.occurred_at <= stop.occurred_at]
        assert later[-1] is snapshot, "resumes from the last snapshot before the interruption"
    assert interrupted > 20


def test_training_batches_consume_each_decided_trajectory_once() -> None:
    scenario = _small()
    events = list(generate(scenario))
    published = _publications(events)
    trajectories = _trajectories(events)
    verdict_time: dict[str, datetime] = {}
    decided: set[str] = set()
    for trajectory_id, trajectory in trajectories.items():
        finished: RolloutFinished = trajectory.one(RolloutFinished)
        for verdict in trajectory.all(VerificationFinished):
            verdict_time[trajectory_id] = verdict.occurred_at
            matches = verdict.artifact_digest == finished.artifact_digest
            if verdict.verdict in (Verdict.PASSED, Verdict.FAILED) and matches:
                decided.add(trajectory_id)
    batches = [e for e in events if isinstance(e, BatchConsumed)]
    consumed = [t for batch in batches for t in batch.trajectory_ids]
    assert sorted(consumed) == sorted(decided)
    assert all(len(b.trajectory_ids) == 32 for b in batches[:-1]) and 0 < len(batches[-1].trajectory_ids) <= 32
    for batch in batches:
        assert batch.trainer_version == bisect_right(published, batch.occurred_at)
        ready = max(verdict_time[t] for t in batch.trajectory_ids)
        assert batch.occurred_at == ready + timedelta(seconds=10)


def test_no_training_no_batches() -> None:
    assert not any(isinstance(e, BatchConsumed) for e in generate(_small(training=None)))


# -- delivery faults ---------------------------------------------------------------------------


def _faulty(**delivery: Any) -> Scenario:
    return _small(delivery={"duplicate_rate": 0.1, "late_rate": 0.1, "late_by": "2m", **delivery})


def test_duplicates_repeat_identical_events() -> None:
    events = list(generate(_faulty()))
    copies: dict[Any, list[bytes]] = defaultdict(list)
    for event in events:
        copies[event.event_id].append(encode_event(event))
    repeated = [wire for wire in copies.values() if len(wire) > 1]
    assert len(repeated) > 50
    assert all(len(set(wire)) == 1 for wire in repeated)
    for event_id, wire in copies.items():
        if len(wire) > 1:
            positions = [i for i, e in enumerate(events) if e.event_id == event_id]
            assert positions[0] < positions[1]


def test_late_events_are_displaced_by_at_most_late_by() -> None:
    events = list(generate(_faulty(duplicate_rate=0.0)))
    newest = events[0].occurred_at
    displaced = 0
    for event in events:
        if event.occurred_at < newest:
            displaced += 1
            assert newest - event.occurred_at <= timedelta(minutes=2)
        newest = max(newest, event.occurred_at)
    assert displaced > 50


def test_delivery_faults_change_delivery_only() -> None:
    clean = list(generate(_small()))
    faulty = list(generate(_faulty()))
    assert len(faulty) > len(clean)
    assert {e.event_id: e for e in faulty} == {e.event_id: e for e in clean}
    _assert_matches(_observed(faulty), expected_counts(_faulty()))
    assert expected_counts(_faulty()) == expected_counts(_small())
    policy = [e for e in faulty if not hasattr(e, "trajectory_id")]
    assert policy == [e for e in clean if not hasattr(e, "trajectory_id")]


# -- sample allocation -------------------------------------------------------------------------


def test_sample_allocation_is_random_but_reproducible() -> None:
    scenario = _small(allocation="sample", trajectories=4000, training=None)
    events = list(generate(scenario))
    assert [encode_event(e) for e in events[:500]] == [encode_event(e) for e in list(generate(scenario))[:500]]
    times = [e.occurred_at for e in events]
    assert times == sorted(times)
    observed = _observed(events)
    expected = expected_counts(scenario)
    assert isinstance(expected["domains"]["code"]["finished"], float)
    for name, want in expected["domains"].items():
        for key in ("finished", "env_valid", "decided", "passed", "undecidable", "digest_mismatch"):
            mean = want[key]  # type: ignore[literal-required]
            assert abs(observed[name].get(key, 0) - mean) <= 5 * mean**0.5 + 5, (name, key)
    assert sum(c["finished"] for c in observed.values()) == 4000


# -- publishing --------------------------------------------------------------------------------


class FakeProducer:
    """Records what publish() does with a producer."""

    def __init__(self, *, full_every: int = 0) -> None:
        self.sent: list[Envelope] = []
        self.polls = 0
        self.flushed = 0
        self.full_every = full_every
        self.refused = 0
        self.closed = False

    def send(self, event: Envelope) -> None:
        if self.full_every and len(self.sent) % self.full_every == 1 and self.refused < len(self.sent):
            self.refused = len(self.sent)
            raise BufferError("queue full")
        self.sent.append(event)

    def poll(self, timeout: float = 0.0) -> int:
        self.polls += 1
        return 0

    def flush(self, timeout: float = 30.0) -> None:
        self.flushed += 1

    def close(self, timeout: float = 30.0) -> None:
        self.closed = True


def test_publish_sends_everything_in_order() -> None:
    events = list(_events("golden.yaml"))
    producer = FakeProducer()
    calls: list[tuple[int, int | None]] = []
    report = publish(events, producer, progress=lambda done, total: calls.append((done, total)))
    assert producer.sent == events
    assert producer.flushed == 1 and producer.polls >= len(events) // 500
    assert isinstance(report, PublishReport)
    assert report.published == len(events)
    assert report.by_type == dict(Counter(e.event_type for e in events))  # type: ignore[attr-defined]
    assert calls[-1] == (len(events), len(events))
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)


def test_publish_retries_when_the_local_queue_is_full() -> None:
    events = list(_events("golden.yaml"))[:100]
    producer = FakeProducer(full_every=10)
    publish(iter(events), producer)
    assert producer.sent == events and producer.refused


def test_publish_paces_by_rate() -> None:
    events = list(_events("golden.yaml"))[:51]
    began = time.monotonic()
    publish(events, FakeProducer(), rate=500)
    assert time.monotonic() - began >= 0.09


def test_publish_paces_by_event_time() -> None:
    start = _scenario("golden.yaml").start
    events = [e for e in _events("golden.yaml") if e.occurred_at <= start + timedelta(seconds=30)]
    span = (events[-1].occurred_at - events[0].occurred_at).total_seconds()
    assert span > 10
    began = time.monotonic()
    publish(events, FakeProducer(), speed=100)
    assert time.monotonic() - began >= span / 100 * 0.9


def test_publish_refuses_two_paces() -> None:
    with pytest.raises(ValueError):
        publish([], FakeProducer(), rate=1, speed=1)
    with pytest.raises(ValueError):
        publish([], FakeProducer(), rate=0)


# -- the command -------------------------------------------------------------------------------


def _cli() -> typer.Typer:
    app = typer.Typer(pretty_exceptions_enable=False, add_completion=False)

    @app.callback()
    def root() -> None:
        """Test root."""

    simulate_command.register(app)
    return app


def test_cli_help_teaches_the_scenario_keys() -> None:
    result = CliRunner().invoke(_cli(), ["simulate", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for word in ("scenarios/default.yaml", "async_lag", "pass_rate", "--dry-run", "--speed", "--rate"):
        assert word in result.output


def test_cli_dry_run_summarises_without_a_broker() -> None:
    golden = str(SCENARIOS / "golden.yaml")
    result = CliRunner().invoke(_cli(), ["simulate", "--scenario", golden, "--dry-run"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "4,045" in result.output  # events
    assert "sandbox.rollout_finished" in result.output
    assert "dependency_unreachable" in result.output
    assert "401" in result.output  # passed in total


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rate", "10", "--speed", "max"], "not both"),
        (["--speed", "fast"], "--speed takes 'max' or a positive number"),
        (["--speed", "0"], "--speed must be a positive number"),
        (["--rate", "-3"], "--rate must be a positive number"),
        (["--run-id", ""], "run_id"),
    ],
)
def test_cli_bad_arguments_are_one_line_errors(args: list[str], message: str) -> None:
    golden = str(SCENARIOS / "golden.yaml")
    result = CliRunner().invoke(_cli(), ["simulate", "--scenario", golden, "--dry-run", *args])
    assert result.exit_code == 1
    assert message in result.output
    assert "Traceback" not in result.output
    assert result.output.startswith("error:") and result.output.strip().count("\n") == 0


def test_cli_bad_files_are_one_line_errors(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("run_id: [\n", encoding="utf-8")
    invalid = tmp_path / "invalid.yaml"
    invalid.write_text("run_id: x\n", encoding="utf-8")
    for path, message in [
        (tmp_path / "missing.yaml", "no such scenario file"),
        (broken, "invalid YAML"),
        (invalid, "required key is missing"),
    ]:
        result = CliRunner().invoke(_cli(), ["simulate", "--scenario", str(path), "--dry-run"])
        assert result.exit_code == 1, result.output
        assert "error:" in result.output and message in result.output
        assert result.output.startswith("error:") and result.output.strip().count("\n") == 0
        assert isinstance(result.exception, SystemExit)


def test_cli_publishes_through_the_kafka_producer(monkeypatch: pytest.MonkeyPatch) -> None:
    producers: list[FakeProducer] = []

    class EventProducer(FakeProducer):
        @classmethod
        def from_settings(cls, settings: object, **kwargs: object) -> EventProducer:
            producer = cls()
            producers.append(producer)
            return producer

    module = types.ModuleType("producers.kafka")
    module.EventProducer = EventProducer  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "producers.kafka", module)
    golden = str(SCENARIOS / "golden.yaml")
    result = CliRunner().invoke(
        _cli(), ["simulate", "--scenario", golden, "--seed", "3", "--run-id", "golden-b"], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    (producer,) = producers
    assert len(producer.sent) == 4045 and producer.flushed == 1 and producer.closed
    assert {e.run_id for e in producer.sent} == {"golden-b"}
    assert "published 4,045 events" in result.output
