"""Window metrics from trajectory records (pure): one function per metric family.

Every metric is in event time: a trajectory belongs to the window its finish falls in; a
consumption by a training batch to the window of the batch's event. A window's rows are always
recomputed from *all* records of that window, never incremented, so re-delivery, late events,
crashes and the number of workers cannot change them.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from streams.trajectory import TrajectoryRecord, VersionTimeline

Row = dict[str, Any]


@dataclass(frozen=True, slots=True)
class RunConfig:
    """What a run declared in ``policy.run_configured`` (defaults when it never did)."""

    domain_weights: dict[str, float]
    staleness_bound: int


@dataclass(frozen=True, slots=True)
class Consumption:
    """One trajectory consumed by one training batch."""

    run_id: str
    batch_id: str
    trajectory_id: str
    trainer_version: int
    consumed_at: datetime


@dataclass(frozen=True, slots=True)
class WindowKey:
    """One metric window: run × domain × window start."""

    run_id: str
    domain: str
    window_start: datetime


def quantile_exact(values: Sequence[float], q: float) -> float | None:
    """The element at index floor(q·n) of the sorted values (ClickHouse ``quantileExact``); None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def normalised_weights(weights: dict[str, float]) -> dict[str, float]:
    """Domain weights scaled to sum to 1 (all zero when they sum to 0)."""
    total = sum(weights.values())
    return {d: (w / total if total > 0 else 0.0) for d, w in weights.items()}


def _window_base(key: WindowKey, window_s: int) -> Row:
    """The key columns every family row of a window carries."""
    return {"run_id": key.run_id, "domain": key.domain, "window_start": key.window_start,
            "window_end": key.window_start + timedelta(seconds=window_s)}


def window_rows(
    key: WindowKey,
    window_s: int,
    records: Sequence[TrajectoryRecord],
    consumptions: Sequence[tuple[Consumption, TrajectoryRecord]],
    run_config: RunConfig,
    timeline: VersionTimeline,
) -> dict[str, list[Row]]:
    """Every family's rows for one window, from the finished records and consumptions that fall in it."""
    base = _window_base(key, window_s)
    done = [r for r in records if r.finished]
    return {
        "m_throughput": [throughput_row(base, done)],
        "m_env_failures": env_failure_rows(base, done),
        "m_domain_quality": quality_rows(base, done),
        "m_policy_lag": lag_rows(base, done, consumptions, run_config, timeline),
        "m_timing": [timing_row(base, done)],
        "m_interruptions": interruption_rows(base, done),
        "m_budget": [budget_row(base, done, run_config)],
        "m_snapshots": [snapshot_row(base, done)],
        "m_verifier_integrity": integrity_rows(base, done),
    }


def breakdown_rows(key: WindowKey, window_s: int, records: Sequence[TrajectoryRecord]) -> dict[str, list[Row]]:
    """The window's finished trajectories broken down by undecidable reason and by environment version.

    Families beside ``window_rows``'s, stored with the same window and version.
    """
    base = _window_base(key, window_s)
    done = [r for r in records if r.finished]
    return {
        "m_undecidable": undecidable_rows(base, done),
        "m_environment_versions": environment_version_rows(base, done),
    }


def throughput_row(base: Row, done: Sequence[TrajectoryRecord]) -> Row:
    """finished, env_valid, decided (= effective), passed, undecidable, digest mismatches, model errors."""
    env_valid = [r for r in done if not r.env_failed]
    decided = [r for r in env_valid if r.decided]
    return {
        **base,
        "finished": len(done),
        "env_valid": len(env_valid),
        "decided": len(decided),
        "passed": sum(1 for r in decided if r.passed),
        "undecidable": len(env_valid) - len(decided),
        "digest_mismatches": sum(1 for r in env_valid if r.verdict and not r.digest_match),
        "model_errors": sum(1 for r in done if r.model_error),
    }


def env_failure_rows(base: Row, done: Sequence[TrajectoryRecord]) -> list[Row]:
    """Trajectories per (origin, failure class, environment version) among the window's finished ones."""
    counts = Counter((r.failure_origin, r.failure_class, r.environment_version) for r in done if r.failure_class)
    return [
        {**base, "origin": origin, "failure_class": cls, "environment_version": env, "failures": n,
         "finished": len(done)}
        for (origin, cls, env), n in sorted(counts.items())
    ]


def quality_rows(base: Row, done: Sequence[TrajectoryRecord]) -> list[Row]:
    """Decided and passed trajectories per policy version (the version the rollout started on)."""
    per_version: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for r in done:
        if r.decided and r.policy_version is not None:
            per_version[r.policy_version][0] += 1
            per_version[r.policy_version][1] += int(r.passed)
    return [
        {**base, "policy_version": v, "decided": d, "passed": p}
        for v, (d, p) in sorted(per_version.items())
    ]


def _lag_stats(versions: list[float], seconds: list[float], bound: int) -> Row:
    return {
        "trajectories": len(versions),
        "lag_versions_p50": quantile_exact(versions, 0.5),
        "lag_versions_p95": quantile_exact(versions, 0.95),
        "lag_versions_max": max(versions) if versions else None,
        "lag_seconds_p50": quantile_exact(seconds, 0.5),
        "lag_seconds_p95": quantile_exact(seconds, 0.95),
        "lag_seconds_max": max(seconds) if seconds else None,
        "over_bound": sum(1 for v in versions if v > bound),
        "staleness_bound": bound,
    }


def consumption_lag(consumption: Consumption, record: TrajectoryRecord, timeline: VersionTimeline
                    ) -> tuple[int, float] | None:
    """Lag at consumption: trainer version − oldest version used, and seconds since the first newer version."""
    oldest = record.oldest_policy_version
    if oldest is None:
        return None
    newer_at = timeline.first_newer_than(oldest)
    seconds = max(0.0, (consumption.consumed_at - newer_at).total_seconds()) if newer_at is not None else 0.0
    return max(0, consumption.trainer_version - oldest), seconds


def lag_rows(
    base: Row,
    done: Sequence[TrajectoryRecord],
    consumptions: Sequence[tuple[Consumption, TrajectoryRecord]],
    run_config: RunConfig,
    timeline: VersionTimeline,
) -> list[Row]:
    """Policy lag at finish and at consumption: p50, p95, max in versions and seconds, count over the bound."""
    rows: list[Row] = []
    at_finish = [r for r in done if r.lag_versions is not None and r.lag_seconds is not None]
    if at_finish:
        stats = _lag_stats([float(r.lag_versions) for r in at_finish if r.lag_versions is not None],
                           [float(r.lag_seconds) for r in at_finish if r.lag_seconds is not None],
                           run_config.staleness_bound)
        rows.append({**base, "stage": "finish", **stats})
    lags = [lag for c, rec in consumptions if (lag := consumption_lag(c, rec, timeline)) is not None]
    if lags:
        stats = _lag_stats([float(v) for v, _ in lags], [s for _, s in lags], run_config.staleness_bound)
        rows.append({**base, "stage": "consumption", **stats})
    return rows


def timing_row(base: Row, done: Sequence[TrajectoryRecord]) -> Row:
    """Wait time (started − queued) and run time (finished − started): p50 and p95 in seconds."""
    waits = [r.wait_s for r in done if r.wait_s is not None]
    runs = [r.run_s for r in done if r.run_s is not None]
    return {
        **base,
        "finished": len(done),
        "wait_s_p50": quantile_exact(waits, 0.5),
        "wait_s_p95": quantile_exact(waits, 0.95),
        "run_s_p50": quantile_exact(runs, 0.5),
        "run_s_p95": quantile_exact(runs, 0.95),
        "interruptions": sum(r.interruptions for r in done),
    }


def interruption_rows(base: Row, done: Sequence[TrajectoryRecord]) -> list[Row]:
    """Interruptions by reason among the window's finished trajectories."""
    counts = Counter(reason for r in done for reason in r.interruption_reasons)
    return [{**base, "reason": reason, "interruptions": n} for reason, n in sorted(counts.items())]


def budget_row(base: Row, done: Sequence[TrajectoryRecord], run_config: RunConfig) -> Row:
    """Sandbox-seconds spent (run time of finished trajectories), effective trajectories, configured weight."""
    weights = normalised_weights(run_config.domain_weights)
    return {
        **base,
        "sandbox_seconds": sum(r.run_s for r in done if r.run_s is not None),
        "effective": sum(1 for r in done if r.decided),
        "configured_weight": weights.get(base["domain"], 0.0),
    }


def snapshot_row(base: Row, done: Sequence[TrajectoryRecord]) -> Row:
    """Snapshots and resumes of the window's finished trajectories, and how resumed ones ended."""
    resumed = [r for r in done if r.resumes > 0]
    return {
        **base,
        "snapshots": sum(r.snapshots for r in done),
        "snapshot_bytes": sum(r.snapshot_bytes for r in done),
        "resumes": sum(r.resumes for r in done),
        "resumes_succeeded": sum(r.resumes_succeeded for r in done),
        "steps_restored": sum(r.steps_restored for r in done),
        "resumed_trajectories": len(resumed),
        "resumed_passed": sum(1 for r in resumed if r.passed),
    }


def integrity_rows(base: Row, done: Sequence[TrajectoryRecord]) -> list[Row]:
    """Per verifier version: verdicts by outcome, digest mismatches, completed-but-failed claims."""
    groups: dict[str, list[TrajectoryRecord]] = defaultdict(list)
    for r in done:
        if r.verdict:
            groups[r.verifier_version].append(r)
    rows: list[Row] = []
    for version, recs in sorted(groups.items()):
        outcome = Counter(r.verdict for r in recs)
        rows.append({
            **base,
            "verifier_version": version,
            "verdicts": len(recs),
            "passed": outcome.get("passed", 0),
            "failed": outcome.get("failed", 0),
            "undecidable": outcome.get("undecidable", 0),
            "errors": outcome.get("error", 0),
            "digest_mismatches": sum(1 for r in recs if not r.digest_match),
            "claimed_complete_failed": sum(1 for r in recs if r.claimed_complete and r.verdict == "failed"),
        })
    return rows


def undecidable_rows(base: Row, done: Sequence[TrajectoryRecord]) -> list[Row]:
    """Env-valid, undecided trajectories per undecidable reason (the first reason that applies)."""
    counts = Counter(r.undecidable_reason for r in done if r.undecidable_reason)
    return [{**base, "undecidable_reason": reason, "trajectories": n} for reason, n in sorted(counts.items())]


def environment_version_rows(base: Row, done: Sequence[TrajectoryRecord]) -> list[Row]:
    """Finished trajectories per environment version, and how many of them had an environment failure."""
    per_version: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in done:
        per_version[r.environment_version][0] += 1
        per_version[r.environment_version][1] += int(r.env_failed)
    return [
        {**base, "environment_version": version, "finished": n, "env_failed": failed}
        for version, (n, failed) in sorted(per_version.items())
    ]


def version_counts(rows: Iterable[Row]) -> dict[int, tuple[int, int]]:
    """Sum decided and passed per policy version over ``m_domain_quality`` rows."""
    totals: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for row in rows:
        totals[int(row["policy_version"])][0] += int(row["decided"])
        totals[int(row["policy_version"])][1] += int(row["passed"])
    return {v: (d, p) for v, (d, p) in totals.items()}
