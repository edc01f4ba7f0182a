"""Window metrics (pure): each family's rows from hand-made trajectory records, as a user of the tables reads them."""

from __future__ import annotations

import itertools
import math
import random
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from schemas import (
    Envelope,
    EnvironmentFailed,
    Origin,
    Producer,
    RolloutFinished,
    RolloutInterrupted,
    RolloutQueued,
    RolloutResumed,
    RolloutStarted,
    SnapshotTaken,
    VerificationFinished,
)
from schemas.events import InterruptReason, Termination, Verdict
from streams.metrics import (
    Consumption,
    Row,
    RunConfig,
    WindowKey,
    breakdown_rows,
    budget_row,
    consumption_lag,
    env_failure_rows,
    environment_version_rows,
    integrity_rows,
    interruption_rows,
    lag_rows,
    normalised_weights,
    quality_rows,
    quantile_exact,
    snapshot_row,
    throughput_row,
    timing_row,
    undecidable_rows,
    version_counts,
    window_rows,
)
from streams.trajectory import AssemblyConfig, TrajectoryRecord, VersionTimeline, assemble

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
RUN = "run-unit"
DOMAIN = "code"
DIGEST = "sha256:aaaa"
WINDOW_S = 60
BASE: Row = {"run_id": RUN, "domain": DOMAIN, "window_start": T0, "window_end": T0 + timedelta(seconds=WINDOW_S)}
RUN_CONFIG = RunConfig(domain_weights={"code": 3.0, "math": 1.0}, staleness_bound=2)
NO_TIMELINE = VersionTimeline()

SANDBOX = Producer(kind="sandbox", id="sb-host-1", version="1.0")
VERIFIER = Producer(kind="verifier", id="vf-host-1", version="1.0")

FAMILIES = {
    "m_throughput",
    "m_env_failures",
    "m_domain_quality",
    "m_policy_lag",
    "m_timing",
    "m_interruptions",
    "m_budget",
    "m_snapshots",
    "m_verifier_integrity",
}

_ids = itertools.count(1)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def trajectory(
    tid: str,
    *,
    outcome: Verdict | None = Verdict.PASSED,
    verified_digest: str = DIGEST,
    verdict_delay: float = 15,
    env_failure: str | None = None,
    model_failure: bool = False,
    policy_version: int = 3,
    finish: float | None = 30,
    wait: float = 5,
    run: float = 20,
    termination: Termination = Termination.COMPLETED,
    environment_version: str = "env-1",
    verifier_version: str = "v1",
    snapshots: tuple[int, ...] = (),
    resumes: tuple[bool, ...] = (),
    interruptions: tuple[InterruptReason, ...] = (),
) -> TrajectoryRecord:
    """Assemble the record of one trajectory from its events; ``finish=None`` leaves it running."""
    end = finish if finish is not None else 30
    start = end - run

    def envelope(seconds: float, producer: Producer = SANDBOX) -> dict[str, object]:
        return {"event_id": uuid.UUID(int=next(_ids), version=4), "occurred_at": at(seconds), "run_id": RUN,
                "producer": producer, "trajectory_id": tid, "domain": DOMAIN}

    events: list[Envelope] = [
        RolloutQueued(**envelope(start - wait), task_id=f"task-{tid}", environment_version=environment_version),
        RolloutStarted(**envelope(start), policy_version=policy_version, sandbox_id=f"sandbox-{tid}",
                       sandbox_pool="default"),
    ]
    events += [SnapshotTaken(**envelope(start + 1), snapshot_id=f"snap-{i}", step=i, filesystem_digest="sha256:fs",
                             context_digest="sha256:ctx", bytes=size, duration_s=0.5)
               for i, size in enumerate(snapshots)]
    events += [RolloutResumed(**envelope(start + 2), snapshot_id="snap-0", steps_restored=4, succeeded=ok)
               for ok in resumes]
    events += [RolloutInterrupted(**envelope(start + 1.5), reason=reason) for reason in interruptions]
    if model_failure:
        events.append(EnvironmentFailed(**envelope(end - 2), failure_class="invalid_tool_call", origin=Origin.MODEL))
    if env_failure is not None:
        events.append(EnvironmentFailed(**envelope(end - 1), failure_class=env_failure, origin=Origin.ENVIRONMENT))
    if finish is not None:
        events.append(RolloutFinished(**envelope(end), termination=termination, steps=10, tokens=2000,
                                      artifact_digest=DIGEST, oldest_policy_version=policy_version,
                                      newest_policy_version=policy_version))
    if outcome is not None:
        events.append(VerificationFinished(**envelope(end + verdict_delay, VERIFIER), verifier_id="unit-verifier",
                                           verifier_version=verifier_version, verdict=outcome,
                                           artifact_digest=verified_digest))
    record = assemble(events, NO_TIMELINE, AssemblyConfig())
    assert record is not None
    return record


# --- quantile_exact ----------------------------------------------------------------------------------------------


def clickhouse_quantile_exact(values: list[float], q: float) -> float:
    """ClickHouse quantileExact: the element at index floor(q·n) of the sorted values (the last one for q = 1)."""
    ordered = sorted(values)
    return ordered[min(math.floor(q * len(ordered)), len(ordered) - 1)]


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([42.0], 0.5, 42.0),
        ([42.0], 0.95, 42.0),
        ([7.0, 3.0], 0.5, 7.0),  # index floor(1.0) = 1: the upper of the two, not their mean
        ([7.0, 3.0], 0.95, 7.0),
        ([4.0, 1.0, 3.0, 2.0], 0.5, 3.0),  # index 2
        ([4.0, 1.0, 3.0, 2.0], 0.95, 4.0),  # index floor(3.8) = 3
        ([100.0, 10.0, 90.0, 20.0, 80.0, 30.0, 70.0, 40.0, 60.0, 50.0], 0.5, 60.0),  # index 5
        ([100.0, 10.0, 90.0, 20.0, 80.0, 30.0, 70.0, 40.0, 60.0, 50.0], 0.95, 100.0),  # index floor(9.5) = 9
        ([1.0, 2.0, 3.0], 0.0, 1.0),
        ([1.0, 2.0, 3.0], 1.0, 3.0),
    ],
)
def test_quantile_exact_on_hand_made_lists(values: list[float], q: float, expected: float) -> None:
    assert quantile_exact(values, q) == expected
    assert quantile_exact(values, q) == clickhouse_quantile_exact(values, q)


@pytest.mark.parametrize("q", [0.5, 0.95])
def test_quantile_exact_on_a_hundred_shuffled_values(q: float) -> None:
    values = [float(v) for v in range(100)]
    random.Random(7).shuffle(values)

    assert quantile_exact(values, q) == {0.5: 50.0, 0.95: 95.0}[q]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 10, 19, 20, 21, 60, 99, 100, 101])
@pytest.mark.parametrize("q", [0.5, 0.95, 0.99])
def test_quantile_exact_follows_the_clickhouse_rule(n: int, q: float) -> None:
    values = [float(v * v % 97) for v in range(n)]

    assert quantile_exact(values, q) == clickhouse_quantile_exact(values, q)


def test_quantile_exact_of_nothing_is_none() -> None:
    assert quantile_exact([], 0.5) is None
    assert quantile_exact([], 0.95) is None


# --- throughput --------------------------------------------------------------------------------------------------


def mixed_window() -> list[TrajectoryRecord]:
    """Nine finished trajectories of every kind."""
    return [
        trajectory("passed-v3", policy_version=3),
        trajectory("failed-v3", outcome=Verdict.FAILED, policy_version=3),
        trajectory("passed-v4", policy_version=4),
        trajectory("model-error", outcome=Verdict.FAILED, model_failure=True, termination=Termination.AGENT_ERROR),
        trajectory("env-failed", env_failure="dependency_unreachable",
                   termination=Termination.ENVIRONMENT_FAILURE),  # with a passing verdict on its digest
        trajectory("mismatch", verified_digest="sha256:other"),
        trajectory("no-verdict", outcome=None),
        trajectory("late", verdict_delay=601),
        trajectory("undecidable", outcome=Verdict.UNDECIDABLE),
    ]


def test_throughput_counts_each_kind_of_trajectory() -> None:
    row = throughput_row(BASE, mixed_window())

    assert row == {
        **BASE,
        "finished": 9,
        "env_valid": 8,
        "decided": 4,  # passed-v3, failed-v3, passed-v4, model-error
        "passed": 2,
        "undecidable": 4,  # mismatch, no-verdict, late, undecidable
        "digest_mismatches": 1,
        "model_errors": 1,
    }


def test_throughput_rates_follow_the_design_formulas() -> None:
    row = throughput_row(BASE, mixed_window())

    assert row["decided"] + row["undecidable"] == row["env_valid"]
    assert row["env_valid"] / row["finished"] == pytest.approx(8 / 9)  # environment validity rate
    assert row["decided"] / row["env_valid"] == pytest.approx(4 / 8)  # decidable ratio
    assert row["passed"] / row["decided"] == pytest.approx(2 / 4)  # pass rate


def test_throughput_of_an_empty_window_is_all_zero() -> None:
    row = throughput_row(BASE, [])

    assert {k: v for k, v in row.items() if k not in BASE} == {
        "finished": 0, "env_valid": 0, "decided": 0, "passed": 0, "undecidable": 0,
        "digest_mismatches": 0, "model_errors": 0,
    }


def test_throughput_built_with_replace_on_a_base_record() -> None:
    base = trajectory("base")
    records = [
        base,
        replace(base, trajectory_id="t2", passed=False, verdict="failed"),
        replace(base, trajectory_id="t3", env_failed=True, decided=False, passed=False,
                failure_class="sandbox_crash", failure_origin="environment"),
        replace(base, trajectory_id="t4", decided=False, passed=False, digest_match=False,
                undecidable_reason="digest_mismatch"),
    ]

    row = throughput_row(BASE, records)

    assert (row["finished"], row["env_valid"], row["decided"], row["passed"]) == (4, 3, 2, 1)
    assert (row["undecidable"], row["digest_mismatches"], row["model_errors"]) == (1, 1, 0)


# --- environment failures ----------------------------------------------------------------------------------------


def test_env_failure_rows_group_by_origin_class_and_environment_version() -> None:
    records = [
        trajectory("a", env_failure="dependency_unreachable", environment_version="env-1"),
        trajectory("b", env_failure="dependency_unreachable", environment_version="env-1"),
        trajectory("c", env_failure="dependency_unreachable", environment_version="env-2"),
        trajectory("d", env_failure="sandbox_crash", environment_version="env-1"),
        trajectory("e", model_failure=True, outcome=Verdict.FAILED, environment_version="env-1"),
        trajectory("ok-1"),
        trajectory("ok-2"),
        trajectory("ok-3", outcome=None),
    ]

    rows = env_failure_rows(BASE, records)

    assert [(r["origin"], r["failure_class"], r["environment_version"], r["failures"]) for r in rows] == [
        ("environment", "dependency_unreachable", "env-1", 2),
        ("environment", "dependency_unreachable", "env-2", 1),
        ("environment", "sandbox_crash", "env-1", 1),
        ("model", "invalid_tool_call", "env-1", 1),
    ]
    assert all(r["finished"] == 8 for r in rows)  # the window's finished trajectories are the denominator
    assert all(r[k] == v for r in rows for k, v in BASE.items())


def test_env_failure_rows_of_a_clean_window_are_empty() -> None:
    assert env_failure_rows(BASE, [trajectory("ok-1"), trajectory("ok-2", outcome=None)]) == []


def test_env_failure_rate_per_class() -> None:
    records = [trajectory(f"fail-{i}", env_failure="timeout") for i in range(3)]
    records += [trajectory(f"ok-{i}") for i in range(7)]

    (row,) = env_failure_rows(BASE, records)

    assert row["failures"] / row["finished"] == pytest.approx(0.3)


# --- domain quality ----------------------------------------------------------------------------------------------


def test_quality_rows_count_decided_and_passed_per_policy_version() -> None:
    rows = quality_rows(BASE, mixed_window())

    assert [(r["policy_version"], r["decided"], r["passed"]) for r in rows] == [
        (3, 3, 1),  # passed-v3, failed-v3, model-error (started on the default version 3)
        (4, 1, 1),
    ]
    assert all(r[k] == v for r in rows for k, v in BASE.items())


def test_quality_rows_ignore_undecided_trajectories() -> None:
    records = [
        trajectory("undecided-v5", policy_version=5, outcome=None),
        trajectory("mismatch-v5", policy_version=5, verified_digest="sha256:other"),
        trajectory("env-failed-v5", policy_version=5, env_failure="timeout"),
        trajectory("decided-v6", policy_version=6),
    ]

    rows = quality_rows(BASE, records)

    assert [(r["policy_version"], r["decided"], r["passed"]) for r in rows] == [(6, 1, 1)]


def test_environment_failures_never_change_the_pass_rate() -> None:
    clean = mixed_window()
    env_failed = [
        trajectory(f"env-{v}-{i}", policy_version=v, env_failure=cls)
        for v, cls in ((3, "timeout"), (4, "sandbox_crash"), (5, "license_prompt"))
        for i in range(3)
    ]  # each with a passing verdict on its own artifact

    before = quality_rows(BASE, clean)
    after = quality_rows(BASE, clean + env_failed)

    assert after == before
    assert version_counts(after) == version_counts(before) == {3: (3, 1), 4: (1, 1)}
    throughput_before, throughput_after = throughput_row(BASE, clean), throughput_row(BASE, clean + env_failed)
    assert (throughput_after["decided"], throughput_after["passed"]) == (
        throughput_before["decided"], throughput_before["passed"])
    assert throughput_after["finished"] == throughput_before["finished"] + len(env_failed)
    assert throughput_after["env_valid"] == throughput_before["env_valid"]


def test_version_counts_sum_quality_rows_across_windows() -> None:
    rows = [
        {"policy_version": 3, "decided": 4, "passed": 1},
        {"policy_version": 3, "decided": 2, "passed": 2},
        {"policy_version": 4, "decided": 5, "passed": 0},
    ]

    assert version_counts(rows) == {3: (6, 3), 4: (5, 0)}


# --- policy lag --------------------------------------------------------------------------------------------------


def test_lag_rows_at_finish() -> None:
    base = trajectory("base")
    lags = [(0, 0.0), (1, 10.0), (2, 20.0), (3, 30.0), (5, 50.0)]
    records = [replace(base, trajectory_id=f"t{i}", lag_versions=v, lag_seconds=s) for i, (v, s) in enumerate(lags)]
    records.append(replace(base, trajectory_id="unknown", lag_versions=None, lag_seconds=None))

    (row,) = lag_rows(BASE, records, [], RUN_CONFIG, NO_TIMELINE)

    assert row == {
        **BASE,
        "stage": "finish",
        "trajectories": 5,
        "lag_versions_p50": 2.0,  # index floor(2.5) of [0, 1, 2, 3, 5]
        "lag_versions_p95": 5.0,  # index floor(4.75)
        "lag_versions_max": 5.0,
        "lag_seconds_p50": 20.0,
        "lag_seconds_p95": 50.0,
        "lag_seconds_max": 50.0,
        "over_bound": 2,  # 3 and 5 exceed the bound of 2; a lag equal to the bound does not
        "staleness_bound": 2,
    }


def test_lag_rows_at_consumption() -> None:
    timeline = VersionTimeline.from_pairs([(1, at(-300)), (2, at(-100)), (3, at(0)), (4, at(40))])
    v1 = replace(trajectory("v1", policy_version=1), oldest_policy_version=1)
    v2 = replace(trajectory("v2", policy_version=2), oldest_policy_version=2)
    v4 = replace(trajectory("v4", policy_version=4), oldest_policy_version=4)
    consumed_at = at(50)

    def consumed(record: TrajectoryRecord, trainer_version: int) -> tuple[Consumption, TrajectoryRecord]:
        return Consumption(RUN, "batch-1", record.trajectory_id, trainer_version, consumed_at), record

    consumptions = [consumed(v1, 4), consumed(v2, 4), consumed(v4, 4)]

    assert consumption_lag(*consumptions[0], timeline) == (3, 150.0)  # 4 − 1; since v2 at −100 s
    assert consumption_lag(*consumptions[1], timeline) == (2, 50.0)  # 4 − 2; since v3 at 0 s
    assert consumption_lag(*consumptions[2], timeline) == (0, 0.0)  # nothing newer than v4

    rows = lag_rows(BASE, [], consumptions, RUN_CONFIG, timeline)

    assert len(rows) == 1
    row = rows[0]
    assert row["stage"] == "consumption"
    assert row["trajectories"] == 3
    assert (row["lag_versions_p50"], row["lag_versions_p95"], row["lag_versions_max"]) == (2.0, 3.0, 3.0)
    assert (row["lag_seconds_p50"], row["lag_seconds_p95"], row["lag_seconds_max"]) == (50.0, 150.0, 150.0)
    assert row["over_bound"] == 1
    assert row["staleness_bound"] == 2


def test_consumption_lag_ignores_versions_published_after_the_consumption() -> None:
    timeline = VersionTimeline.from_pairs([(1, at(-10)), (2, at(500))])
    record = replace(trajectory("v1", policy_version=1), oldest_policy_version=1)

    lag = consumption_lag(Consumption(RUN, "b", "v1", 1, at(50)), record, timeline)

    assert lag == (0, 0.0)


def test_consumption_lag_never_goes_negative_and_skips_unknown_versions() -> None:
    record = replace(trajectory("v5", policy_version=5), oldest_policy_version=5)

    assert consumption_lag(Consumption(RUN, "b", "v5", 3, at(50)), record, NO_TIMELINE) == (0, 0.0)
    unknown = replace(record, oldest_policy_version=None)
    assert consumption_lag(Consumption(RUN, "b", "v5", 3, at(50)), unknown, NO_TIMELINE) is None
    assert lag_rows(BASE, [], [(Consumption(RUN, "b", "v5", 3, at(50)), unknown)], RUN_CONFIG, NO_TIMELINE) == []


def test_lag_rows_have_both_stages_and_none_without_data() -> None:
    record = replace(trajectory("t"), lag_versions=1, lag_seconds=5.0)
    consumption = (Consumption(RUN, "b", "t", 3, at(50)), record)

    assert [r["stage"] for r in lag_rows(BASE, [record], [consumption], RUN_CONFIG, NO_TIMELINE)] == [
        "finish", "consumption"]
    assert lag_rows(BASE, [], [], RUN_CONFIG, NO_TIMELINE) == []


# --- timing, interruptions, budget, snapshots ---------------------------------------------------------------------


def test_timing_row_p50_and_p95() -> None:
    base = trajectory("base")
    waits = [1.0, 2.0, 3.0, 4.0, 100.0]
    runs = [10.0, 20.0, 30.0, 40.0, 500.0]
    records = [replace(base, trajectory_id=f"t{i}", wait_s=w, run_s=r, interruptions=i % 2)
               for i, (w, r) in enumerate(zip(waits, runs, strict=True))]
    records.append(replace(base, trajectory_id="never-queued", wait_s=None, run_s=None))

    row = timing_row(BASE, records)

    assert row == {
        **BASE,
        "finished": 6,
        "wait_s_p50": 3.0,
        "wait_s_p95": 100.0,
        "run_s_p50": 30.0,
        "run_s_p95": 500.0,
        "interruptions": 2,
    }


def test_timing_from_assembled_events() -> None:
    records = [trajectory("fast", wait=2, run=10), trajectory("slow", wait=8, run=25)]

    row = timing_row(BASE, records)

    assert (row["wait_s_p50"], row["wait_s_p95"]) == (8.0, 8.0)  # index floor(0.5·2) = 1 of [2, 8]
    assert (row["run_s_p50"], row["run_s_p95"]) == (25.0, 25.0)


def test_timing_of_an_empty_window_has_no_quantiles() -> None:
    row = timing_row(BASE, [])

    assert row["finished"] == 0
    assert row["wait_s_p50"] is row["wait_s_p95"] is row["run_s_p50"] is row["run_s_p95"] is None


def test_interruption_rows_count_by_reason() -> None:
    records = [
        trajectory("a", interruptions=(InterruptReason.PREEMPTED, InterruptReason.PREEMPTED)),
        trajectory("b", interruptions=(InterruptReason.STALE_POLICY,)),
        trajectory("c"),
    ]

    rows = interruption_rows(BASE, records)

    assert [(r["reason"], r["interruptions"]) for r in rows] == [("preempted", 2), ("stale_policy", 1)]


def test_budget_row_uses_normalised_configured_weights() -> None:
    records = [
        trajectory("a", run=20),
        trajectory("b", run=40, outcome=None),
        trajectory("c", run=15, env_failure="timeout"),
    ]

    row = budget_row(BASE, records, RUN_CONFIG)

    assert row == {**BASE, "sandbox_seconds": 75.0, "effective": 1, "configured_weight": 0.75}
    assert row["effective"] * 3600 / row["sandbox_seconds"] == pytest.approx(48.0)  # per sandbox-hour


@pytest.mark.parametrize(
    ("weights", "expected"),
    [
        ({"code": 3.0, "math": 1.0}, 0.75),
        ({"code": 0.3, "math": 0.1}, 0.75),  # the scale of the weights does not matter
        ({"code": 1.0}, 1.0),
        ({"math": 1.0}, 0.0),  # the domain was not configured
        ({"code": 0.0, "math": 0.0}, 0.0),  # weights that sum to 0
        ({}, 0.0),
    ],
)
def test_budget_configured_weight(weights: dict[str, float], expected: float) -> None:
    row = budget_row(BASE, [], RunConfig(domain_weights=weights, staleness_bound=2))

    assert row["configured_weight"] == pytest.approx(expected)
    assert (row["sandbox_seconds"], row["effective"]) == (0, 0)


def test_normalised_weights_sum_to_one() -> None:
    weights = normalised_weights({"code": 2.0, "math": 1.0, "web": 1.0})

    assert weights == pytest.approx({"code": 0.5, "math": 0.25, "web": 0.25})
    assert normalised_weights({"code": 0.0}) == {"code": 0.0}


def test_snapshot_row() -> None:
    records = [
        trajectory("resumed-passed", snapshots=(100, 200), resumes=(True,)),
        trajectory("resumed-failed", outcome=Verdict.FAILED, snapshots=(50,), resumes=(False, True)),
        trajectory("plain"),
    ]

    row = snapshot_row(BASE, records)

    assert row == {
        **BASE,
        "snapshots": 3,
        "snapshot_bytes": 350,
        "resumes": 3,
        "resumes_succeeded": 2,
        "steps_restored": 12,  # 4 per resume
        "resumed_trajectories": 2,
        "resumed_passed": 1,
    }


# --- verifier integrity ------------------------------------------------------------------------------------------


def test_integrity_rows_per_verifier_version() -> None:
    records = [
        trajectory("v1-passed", verifier_version="v1"),
        trajectory("v1-failed-claimed", outcome=Verdict.FAILED, verifier_version="v1"),
        trajectory("v1-failed-max-steps", outcome=Verdict.FAILED, verifier_version="v1",
                   termination=Termination.MAX_STEPS),
        trajectory("v1-mismatch", verified_digest="sha256:other", verifier_version="v1"),
        trajectory("v2-undecidable", outcome=Verdict.UNDECIDABLE, verifier_version="v2"),
        trajectory("v2-error", outcome=Verdict.ERROR, verifier_version="v2"),
        trajectory("v2-failed-claimed", outcome=Verdict.FAILED, verifier_version="v2"),
        trajectory("no-verdict", outcome=None),
    ]

    rows = integrity_rows(BASE, records)

    assert [{k: v for k, v in r.items() if k not in BASE} for r in rows] == [
        {"verifier_version": "v1", "verdicts": 4, "passed": 2, "failed": 2, "undecidable": 0, "errors": 0,
         "digest_mismatches": 1, "claimed_complete_failed": 1},
        {"verifier_version": "v2", "verdicts": 3, "passed": 0, "failed": 1, "undecidable": 1, "errors": 1,
         "digest_mismatches": 0, "claimed_complete_failed": 1},
    ]


def test_undecidable_rows_count_each_reason_once_per_trajectory() -> None:
    records = [*mixed_window(), trajectory("no-verdict-2", outcome=None),
               trajectory("error", outcome=Verdict.ERROR),
               trajectory("env-failed-no-verdict", outcome=None, env_failure="timeout",
                          termination=Termination.ENVIRONMENT_FAILURE)]

    rows = undecidable_rows(BASE, records)

    assert rows == [
        {**BASE, "undecidable_reason": "digest_mismatch", "trajectories": 1},
        {**BASE, "undecidable_reason": "no_verdict", "trajectories": 2},
        {**BASE, "undecidable_reason": "verdict_late", "trajectories": 1},
        {**BASE, "undecidable_reason": "verdict_undecidable", "trajectories": 1},
        {**BASE, "undecidable_reason": "verifier_error", "trajectories": 1},
    ]
    assert sum(r["trajectories"] for r in rows) == throughput_row(BASE, records)["undecidable"]


def test_environment_version_rows_count_finished_and_env_failed_per_version() -> None:
    records = [*mixed_window(),  # all on env-1, one of them env-failed
               trajectory("v2-ok", environment_version="env-2"),
               trajectory("v2-failed", environment_version="env-2", env_failure="sandbox_crash",
                          termination=Termination.ENVIRONMENT_FAILURE),
               trajectory("v2-model", environment_version="env-2", model_failure=True),
               replace(trajectory("no-queued-event"), environment_version="")]

    rows = environment_version_rows(BASE, records)

    assert rows == [
        {**BASE, "environment_version": "", "finished": 1, "env_failed": 0},
        {**BASE, "environment_version": "env-1", "finished": 9, "env_failed": 1},
        {**BASE, "environment_version": "env-2", "finished": 3, "env_failed": 1},
    ]
    assert sum(r["finished"] for r in rows) == throughput_row(BASE, records)["finished"]
    env_failures = env_failure_rows(BASE, records)
    for row in rows:
        assert row["env_failed"] == sum(f["failures"] for f in env_failures if f["origin"] == "environment"
                                        and f["environment_version"] == row["environment_version"])


def test_breakdown_rows_only_count_finished_trajectories() -> None:
    key = WindowKey(RUN, DOMAIN, T0)
    running = [trajectory(f"running-{i}", finish=None, outcome=None) for i in range(3)]

    rows = breakdown_rows(key, WINDOW_S, mixed_window() + running)

    assert rows == {"m_undecidable": undecidable_rows(BASE, mixed_window()),
                    "m_environment_versions": environment_version_rows(BASE, mixed_window())}
    assert breakdown_rows(key, WINDOW_S, running) == {"m_undecidable": [], "m_environment_versions": []}


# --- window_rows -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("window_s", [60, 300])
def test_window_rows_return_every_family_with_the_window_bounds(window_s: int) -> None:
    key = WindowKey(RUN, DOMAIN, T0)
    records = mixed_window() + [trajectory(f"interrupted-{i}", interruptions=(InterruptReason.BUDGET,),
                                           snapshots=(10,), resumes=(True,)) for i in range(2)]
    consumptions = [(Consumption(RUN, "b", r.trajectory_id, 4, at(50)), r) for r in records[:3]]

    tables = window_rows(key, window_s, records, consumptions, RUN_CONFIG, NO_TIMELINE)

    assert set(tables) == FAMILIES
    expected_base = {"run_id": RUN, "domain": DOMAIN, "window_start": T0,
                     "window_end": T0 + timedelta(seconds=window_s)}
    for name, rows in tables.items():
        assert rows, f"{name} has no row"
        for row in rows:
            assert {k: row[k] for k in expected_base} == expected_base, name


def test_window_rows_only_count_finished_trajectories() -> None:
    key = WindowKey(RUN, DOMAIN, T0)
    done = mixed_window()
    running = [trajectory(f"running-{i}", finish=None, outcome=None, env_failure="timeout") for i in range(3)]
    assert all(r.status == "running" for r in running)

    with_running = window_rows(key, WINDOW_S, done + running, [], RUN_CONFIG, NO_TIMELINE)
    without = window_rows(key, WINDOW_S, done, [], RUN_CONFIG, NO_TIMELINE)

    assert with_running == without
    assert with_running["m_throughput"][0]["finished"] == 9


def test_window_rows_match_the_family_functions() -> None:
    key = WindowKey(RUN, DOMAIN, T0)
    records = mixed_window()

    tables = window_rows(key, WINDOW_S, records, [], RUN_CONFIG, NO_TIMELINE)

    assert tables["m_throughput"] == [throughput_row(BASE, records)]
    assert tables["m_env_failures"] == env_failure_rows(BASE, records)
    assert tables["m_domain_quality"] == quality_rows(BASE, records)
    assert tables["m_timing"] == [timing_row(BASE, records)]
    assert tables["m_budget"] == [budget_row(BASE, records, RUN_CONFIG)]
    assert tables["m_snapshots"] == [snapshot_row(BASE, records)]


def test_window_rows_of_an_empty_window() -> None:
    tables = window_rows(WindowKey(RUN, DOMAIN, T0), WINDOW_S, [], [], RUN_CONFIG, NO_TIMELINE)

    assert set(tables) == FAMILIES
    assert tables["m_throughput"][0]["finished"] == 0
    for name in ("m_env_failures", "m_domain_quality", "m_policy_lag", "m_interruptions", "m_verifier_integrity"):
        assert tables[name] == [], name


def test_window_rows_do_not_depend_on_record_order() -> None:
    key = WindowKey(RUN, DOMAIN, T0)
    records = mixed_window()
    shuffled = records[:]
    random.Random(3).shuffle(shuffled)

    assert window_rows(key, WINDOW_S, shuffled, [], RUN_CONFIG, NO_TIMELINE) == window_rows(
        key, WINDOW_S, records, [], RUN_CONFIG, NO_TIMELINE)
