"""One function per panel: what it shows, in which unit, from which query (queries live in queries.py)."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dashboard_builder
from grafana_foundation_sdk.builders import table, timeseries

from dashboards import queries
from dashboards.defaults import (
    DOMAIN_UID,
    FULL,
    HALF,
    THIRD,
    UNIT_BYTES,
    UNIT_COUNT,
    UNIT_PER_HOUR,
    UNIT_RATIO,
    UNIT_SECONDS,
    UNIT_VERSIONS,
    table_panel,
    time_series,
)


def _drill_down_link() -> dashboard_builder.DashboardLink:
    """A data link from a per-domain series to the domain drill-down, keeping run and time range."""
    return (
        dashboard_builder.DashboardLink("Drill down into ${__field.labels.domain}")
        .url(f"/d/{DOMAIN_UID}?${{run:queryparam}}&var-domain=${{__field.labels.domain}}&${{__url_time_range}}")
    )


# -- throughput ----------------------------------------------------------------------------------


def effective_per_hour() -> timeseries.Panel:
    """Effective trajectories per hour, per domain."""
    return time_series(
        "Effective trajectories per hour",
        "Trajectories usable for training (finished, no environment failure, a timely passed/failed "
        "verdict on the right artifact) per hour, by domain. Equals finished/h x environment validity "
        "x decidable ratio (the three panels beside it). Click a series to drill into its domain.",
        unit=UNIT_PER_HOUR, sql=queries.EFFECTIVE_PER_HOUR, min_value=0,
    ).data_links([_drill_down_link()])


def finished_per_hour() -> timeseries.Panel:
    """Finished trajectories per hour, per domain: the first factor of effective throughput."""
    return time_series(
        "Finished per hour",
        "Trajectories that finished per hour, by domain (each counted once, in the window of its finish).",
        unit=UNIT_PER_HOUR, sql=queries.FINISHED_PER_HOUR, width=THIRD, min_value=0,
    )


def env_validity() -> timeseries.Panel:
    """Environment validity per domain: the second factor of effective throughput."""
    return time_series(
        "Environment validity",
        "Share of finished trajectories with no environment-origin failure, by domain "
        "(sum of env-valid / sum of finished in each bucket).",
        unit=UNIT_RATIO, sql=queries.ENV_VALIDITY, width=THIRD, min_value=0, max_value=1,
    )


def decidable_ratio() -> timeseries.Panel:
    """Decidable ratio per domain: the third factor of effective throughput."""
    return time_series(
        "Decidable ratio",
        "Share of env-valid trajectories with a timely passed/failed verdict on the matching artifact "
        "digest, by domain. The rest are undecidable (no or late verdict, verifier error, digest mismatch).",
        unit=UNIT_RATIO, sql=queries.DECIDABLE_RATIO, width=THIRD, min_value=0, max_value=1,
    )


def domain_throughput() -> timeseries.Panel:
    """Finished, env-valid and effective trajectories per hour for the selected domain."""
    return time_series(
        "Throughput funnel",
        "Per hour: finished trajectories, those without an environment failure, and the effective ones "
        "(decided). The gaps between the lines are environment failures and undecidable trajectories.",
        unit=UNIT_PER_HOUR, sql=queries.DOMAIN_THROUGHPUT, width=FULL, min_value=0,
    )


# -- environment failures ------------------------------------------------------------------------


def env_failure_rate_by_class() -> timeseries.Panel:
    """Environment failure rate per failure class."""
    return time_series(
        "Environment failure rate by class",
        "Finished trajectories whose main failure is of environment origin, by failure class, divided by "
        "all finished trajectories of the selected domains. Model errors are not environment failures.",
        unit=UNIT_RATIO, sql=queries.ENV_FAILURE_RATE_BY_CLASS, min_value=0,
    )


def failures_by_origin_class() -> timeseries.Panel:
    """Failed trajectories per bucket by origin and class."""
    return time_series(
        "Failures by origin and class",
        "Finished trajectories per bucket by the origin (environment, model, verifier, scheduler) and "
        "class of their main failure. Each trajectory counts once.",
        unit=UNIT_COUNT, sql=queries.FAILURES_BY_ORIGIN_CLASS, stacked=True, bars=True, min_value=0,
    )


def failure_classes_table() -> table.Panel:
    """Failures over the time range by origin and class, with their rate."""
    return table_panel(
        "Failure classes",
        "Finished trajectories by the origin and class of their main failure over the time range, and "
        "their share of all finished trajectories of the selected domains.",
        unit=UNIT_COUNT, sql=queries.FAILURE_CLASSES_TABLE,
        column_units={"failure_rate": UNIT_RATIO}, sort_by="failures_total",
    )


def env_failures_by_version() -> timeseries.Panel:
    """Environment failures per bucket by environment version and class."""
    return time_series(
        "Environment failures by version and class",
        "Finished trajectories with an environment failure per bucket, by the environment version of the "
        "trajectory (from its queued event) and failure class. A new version with a new class shows here first.",
        unit=UNIT_COUNT, sql=queries.ENV_FAILURES_BY_VERSION, stacked=True, bars=True, min_value=0,
    )


def env_failure_rate_by_version_table() -> table.Panel:
    """Environment failure rate by environment version and class over the time range."""
    return table_panel(
        "Failure rate by environment version",
        "Over the time range: per environment version and failure class, environment failures, finished "
        "trajectories of that version, and the rate. Compare versions to spot a bad environment rollout.",
        unit=UNIT_COUNT, sql=queries.ENV_FAILURE_RATE_BY_VERSION_TABLE,
        column_units={"failure_rate": UNIT_RATIO}, sort_by="failure_rate",
    )


# -- pass rate and regressions -------------------------------------------------------------------


def pass_rate_by_domain_and_version() -> table.Panel:
    """Pass rate per domain and policy version over the time range."""
    return table_panel(
        "Pass rate by domain and policy version",
        "Decided trajectories, passed ones and the pass rate per domain and policy version (the version "
        "the rollout started on) over the time range. Environment failures and undecidable trajectories "
        "never enter the pass rate.",
        unit=UNIT_COUNT, sql=queries.PASS_RATE_BY_DOMAIN_VERSION,
        column_units={"pass_rate": UNIT_RATIO, "policy_version": "none"}, sort_by="policy_version",
        descending=False,
    )


def pass_rate_by_version_over_time() -> timeseries.Panel:
    """Pass rate of each policy version over time."""
    return time_series(
        "Pass rate by policy version",
        "Passed / decided trajectories per policy version over time, for the selected domain.",
        unit=UNIT_RATIO, sql=queries.PASS_RATE_BY_VERSION_OVER_TIME, min_value=0, max_value=1,
    )


def open_alerts() -> table.Panel:
    """Regression alerts currently firing for the run."""
    return table_panel(
        "Open regression alerts",
        "Domains whose pass rate on a policy version dropped significantly against the earlier versions "
        "(one-sided two-proportion test, worker-side). Empty is good.",
        unit=UNIT_RATIO, sql=queries.OPEN_ALERTS, width=FULL,
        column_units={"policy_version": "none", "candidate_decided": UNIT_COUNT, "p_value": "sci",
                      "first_fired_at": "dateTimeAsIso"},
        sort_by="pass_rate_drop",
    )


def domain_alerts() -> table.Panel:
    """Every regression alert of the domain, firing or resolved."""
    return table_panel(
        "Regression alerts of the domain",
        "Every pass-rate regression alert of this domain in the run, firing or resolved, with its evidence.",
        unit=UNIT_RATIO, sql=queries.DOMAIN_ALERTS,
        column_units={"policy_version": "none", "p_value": "sci", "updated_at": "dateTimeAsIso"},
        sort_by="policy_version", descending=False,
    )


# -- policy lag ----------------------------------------------------------------------------------


def policy_lag() -> timeseries.Panel:
    """Policy lag at finish (p50, p95) against the run's staleness bound."""
    return time_series(
        "Policy lag at finish",
        "Versions between the newest published policy and the one a trajectory ran on, at its finish: "
        "p50 and p95 (per-window quantiles cannot be merged, so each bucket shows the highest per-window "
        "value over the selected domains) and the run's staleness bound.",
        unit=UNIT_VERSIONS, sql=queries.POLICY_LAG, min_value=0,
    )


def share_over_bound() -> timeseries.Panel:
    """Share of trajectories whose lag exceeds the staleness bound, at finish and at consumption."""
    return time_series(
        "Share over the staleness bound",
        "Share of measured trajectories whose lag in versions is strictly greater than the run's "
        "staleness bound: at finish, and at consumption by a training batch.",
        unit=UNIT_RATIO, sql=queries.SHARE_OVER_BOUND, min_value=0, max_value=1,
    )


# -- timing, budget, interruptions, snapshots ----------------------------------------------------


def timing() -> timeseries.Panel:
    """Wait and run time quantiles."""
    return time_series(
        "Wait and run time",
        "Wait (queued to started) and run (started to finished) time, p50 and p95. Each bucket shows the "
        "highest per-window quantile (per-window quantiles cannot be merged).",
        unit=UNIT_SECONDS, sql=queries.TIMING, min_value=0,
    )


def budget_share() -> timeseries.Panel:
    """The domain's share of sandbox time against its configured weight."""
    return time_series(
        "Budget share",
        "Share of the run's sandbox time spent on the selected domain, against the share its configured "
        "weight asks for (the run's latest configuration, weights normalised over the run's domains).",
        unit=UNIT_RATIO, sql=queries.BUDGET_SHARE, min_value=0, max_value=1,
    )


def effective_per_sandbox_hour() -> timeseries.Panel:
    """Effective trajectories per sandbox-hour: how much training data a unit of budget buys."""
    return time_series(
        "Effective per sandbox-hour",
        "Effective trajectories per hour of sandbox time (sum of run times of the finished trajectories).",
        unit="suffix: /sandbox-h", sql=queries.EFFECTIVE_PER_SANDBOX_HOUR, min_value=0,
    )


def interruptions_by_reason() -> timeseries.Panel:
    """Interruptions per bucket by reason."""
    return time_series(
        "Interruptions by reason",
        "sandbox.interrupted events of the finished trajectories per bucket, by reason (preempted, "
        "stale_policy, budget, cancelled, sandbox_lost).",
        unit=UNIT_COUNT, sql=queries.INTERRUPTIONS_BY_REASON, stacked=True, bars=True, min_value=0,
    )


def snapshots_and_resumes() -> timeseries.Panel:
    """Snapshots, resumes and successful resumes per bucket."""
    return time_series(
        "Snapshots and resumes",
        "Snapshots taken, resumes from a snapshot, and resumes that succeeded, per bucket (events of the "
        "trajectories finished in the bucket).",
        unit=UNIT_COUNT, sql=queries.SNAPSHOTS_AND_RESUMES, min_value=0,
    )


def resume_success() -> timeseries.Panel:
    """Resume success rate and pass rate after a resume."""
    return time_series(
        "Resume success",
        "Share of resumes that succeeded, and share of resumed trajectories that were decided and passed.",
        unit=UNIT_RATIO, sql=queries.RESUME_SUCCESS, min_value=0, max_value=1,
    )


def snapshot_bytes() -> timeseries.Panel:
    """Snapshot volume per bucket by domain."""
    return time_series(
        "Snapshot volume",
        "Bytes of snapshots taken per bucket, by domain.",
        unit=UNIT_BYTES, sql=queries.SNAPSHOT_BYTES, stacked=True, min_value=0,
    )


# -- verifier integrity --------------------------------------------------------------------------


def digest_mismatches() -> timeseries.Panel:
    """Verdicts on another artifact than the sandbox produced, per verifier version."""
    return time_series(
        "Digest mismatches",
        "Verdicts whose verified artifact digest differs from the sandbox's final artifact digest (or the "
        "artifact has none), per bucket and verifier version. Should be zero: such verdicts are not used.",
        unit=UNIT_COUNT, sql=queries.DIGEST_MISMATCHES, bars=True, min_value=0,
    )


def verdicts_by_verifier() -> table.Panel:
    """Verdict outcomes per verifier version over the time range."""
    return table_panel(
        "Verdicts per verifier version",
        "Over the time range, per verifier version: verdicts (including on env-failed trajectories) by "
        "outcome, digest mismatches, sandboxes that claimed completion but failed, and the mismatch and "
        "error rates.",
        unit=UNIT_COUNT, sql=queries.VERDICTS_BY_VERIFIER, width=FULL,
        column_units={"mismatch_rate": UNIT_RATIO, "error_rate": UNIT_RATIO}, sort_by="verdicts_total",
    )


def verdict_outcomes() -> timeseries.Panel:
    """Verdicts per bucket by outcome."""
    return time_series(
        "Verdict outcomes",
        "Verdicts per bucket by outcome: passed, failed, undecidable (the verifier's own outcome) and error.",
        unit=UNIT_COUNT, sql=queries.VERDICT_OUTCOMES, stacked=True, min_value=0,
    )


def claimed_complete_failed() -> timeseries.Panel:
    """Share of verdicts where the sandbox claimed completion but the verifier failed it."""
    return time_series(
        "Claimed complete, verified failed",
        "Share of verdicts, per verifier version, whose sandbox ended with termination 'completed' while the "
        "verdict is 'failed': agents that believe they are done but are not.",
        unit=UNIT_RATIO, sql=queries.CLAIMED_COMPLETE_FAILED, min_value=0,
    )


def undecidable_reasons() -> table.Panel:
    """Why env-valid trajectories were not decided."""
    return table_panel(
        "Undecidable reasons",
        "Finished, env-valid trajectories without a usable verdict over the time range, by the first reason "
        "that applies: awaiting or timed-out verdict, undecidable verdict, verifier error, late verdict, "
        "digest mismatch.",
        unit=UNIT_COUNT, sql=queries.UNDECIDABLE_REASONS, width=HALF,
        column_units={"reason_share": UNIT_RATIO}, sort_by="trajectories_total",
    )
