"""Every SQL query of the dashboards and alert rules, kept apart from the panels that show them.

Queries read the SQL contract views only (``docs/sql.md``). Dashboard queries use the plugin's
macros and the dashboard variables: ``$__timeFilter(window_start)``, ``$__timeInterval(window_start)``
for buckets, ``IN (${run:singlequote})`` and ``$__conditionalAll(domain IN (${domain:singlequote}), $domain)``.
Alert queries use backend macros only (no template variables reach an alert rule).

Conventions: rates are recomputed from sums (``sum(a) / sum(b)``), never averaged; per-window
quantiles cannot be combined, so a bucket shows the highest per-window quantile in it; new
aliases never reuse a column name (ClickHouse resolves aliases everywhere in a query).
"""

from __future__ import annotations

from textwrap import dedent

RUN = "run_id IN (${run:singlequote})"
DOMAIN = "$__conditionalAll(domain IN (${domain:singlequote}), $domain)"
WINDOW = "$__timeFilter(window_start)"
FILTERS = f"{RUN}\n  AND {DOMAIN}\n  AND {WINDOW}"
"""The filter every windowed dashboard query starts with: the run, the selected domains, the time range."""

BUCKET = "$__timeInterval(window_start)"
PER_HOUR = "3600 / greatest($__interval_s, max(dateDiff('second', window_start, window_end)))"
"""Turns a bucket's sum into a rate per hour: a bucket spans the interval, or one window when finer."""


def _sql(text: str) -> str:
    """Dedent, strip and fill the ``<FILTERS>``, ``<BUCKET>`` and ``<PER_HOUR>`` placeholders."""
    return (
        dedent(text).strip()
        .replace("<FILTERS>", FILTERS)
        .replace("<BUCKET>", BUCKET)
        .replace("<PER_HOUR>", PER_HOUR)
    )


# -- variables -----------------------------------------------------------------------------------

RUN_OPTIONS = _sql("""
    SELECT DISTINCT run_id
    FROM v_effective_throughput
    WHERE $__timeFilter(window_start)
    ORDER BY run_id
""")

DOMAIN_OPTIONS = _sql("""
    SELECT DISTINCT domain
    FROM v_effective_throughput
    WHERE run_id IN (${run:singlequote}) AND $__timeFilter(window_start)
    ORDER BY domain
""")

# -- throughput ----------------------------------------------------------------------------------

EFFECTIVE_PER_HOUR = _sql("""
    SELECT <BUCKET> AS time,
           domain,
           sum(effective) * <PER_HOUR> AS effective_rate
    FROM v_effective_throughput
    WHERE <FILTERS>
    GROUP BY time, domain
    ORDER BY time, domain
""")

FINISHED_PER_HOUR = _sql("""
    SELECT <BUCKET> AS time,
           domain,
           sum(finished) * <PER_HOUR> AS finished_rate
    FROM v_effective_throughput
    WHERE <FILTERS>
    GROUP BY time, domain
    ORDER BY time, domain
""")

ENV_VALIDITY = _sql("""
    SELECT <BUCKET> AS time,
           domain,
           sum(env_valid) / nullIf(sum(finished), 0) AS validity
    FROM v_effective_throughput
    WHERE <FILTERS>
    GROUP BY time, domain
    ORDER BY time, domain
""")

DECIDABLE_RATIO = _sql("""
    SELECT <BUCKET> AS time,
           domain,
           sum(decided) / nullIf(sum(env_valid), 0) AS decidable
    FROM v_effective_throughput
    WHERE <FILTERS>
    GROUP BY time, domain
    ORDER BY time, domain
""")

DOMAIN_THROUGHPUT = _sql("""
    SELECT <BUCKET> AS time,
           sum(finished) * <PER_HOUR> AS finished_per_hour_total,
           sum(env_valid) * <PER_HOUR> AS env_valid_per_hour_total,
           sum(decided) * <PER_HOUR> AS effective_per_hour_total
    FROM v_effective_throughput
    WHERE <FILTERS>
    GROUP BY time
    ORDER BY time
""")

# -- environment failures ------------------------------------------------------------------------

ENV_FAILURE_RATE_BY_CLASS = _sql("""
    SELECT f.time AS time, f.failure_class AS failure_class, f.class_failures / t.finished_total AS failure_rate
    FROM
    (
        SELECT <BUCKET> AS time, failure_class, sum(failures) AS class_failures
        FROM v_env_failures
        WHERE origin = 'environment'
          AND <FILTERS>
        GROUP BY time, failure_class
    ) AS f
    INNER JOIN
    (
        SELECT <BUCKET> AS time, sum(finished) AS finished_total
        FROM v_effective_throughput
        WHERE <FILTERS>
        GROUP BY time
    ) AS t ON f.time = t.time
    ORDER BY time, failure_class
""")

FAILURES_BY_ORIGIN_CLASS = _sql("""
    SELECT <BUCKET> AS time,
           concat(origin, ': ', failure_class) AS origin_class,
           sum(failures) AS class_failures
    FROM v_env_failures
    WHERE <FILTERS>
    GROUP BY time, origin_class
    ORDER BY time, origin_class
""")

FAILURE_CLASSES_TABLE = _sql("""
    SELECT f.origin AS origin, f.failure_class AS failure_class, f.class_failures AS failures_total,
           f.class_failures / t.finished_total AS failure_rate
    FROM
    (
        SELECT origin, failure_class, sum(failures) AS class_failures
        FROM v_env_failures
        WHERE <FILTERS>
        GROUP BY origin, failure_class
    ) AS f
    CROSS JOIN
    (
        SELECT sum(finished) AS finished_total
        FROM v_effective_throughput
        WHERE <FILTERS>
    ) AS t
    ORDER BY failures_total DESC, origin, failure_class
""")

ENV_FAILURES_BY_VERSION = _sql("""
    SELECT <BUCKET> AS time,
           concat(if(environment_version = '', '(none)', environment_version), ' / ', failure_class) AS version_class,
           sum(failures) AS class_failures
    FROM v_env_failures
    WHERE origin = 'environment'
      AND <FILTERS>
    GROUP BY time, version_class
    ORDER BY time, version_class
""")

ENV_FAILURE_RATE_BY_VERSION_TABLE = _sql("""
    SELECT f.environment_version AS environment_version, f.failure_class AS failure_class,
           f.class_failures AS failures_total, t.finished_total AS finished_total,
           f.class_failures / t.finished_total AS failure_rate
    FROM
    (
        SELECT environment_version, failure_class, sum(failures) AS class_failures
        FROM v_env_failures
        WHERE origin = 'environment'
          AND <FILTERS>
        GROUP BY environment_version, failure_class
    ) AS f
    INNER JOIN
    (
        SELECT environment_version, sum(finished) AS finished_total
        FROM v_environment_versions
        WHERE <FILTERS>
        GROUP BY environment_version
    ) AS t ON f.environment_version = t.environment_version
    ORDER BY failure_rate DESC, environment_version, failure_class
""")

# -- pass rate and regressions -------------------------------------------------------------------

PASS_RATE_BY_DOMAIN_VERSION = _sql("""
    SELECT domain,
           policy_version,
           sum(decided) AS decided_total,
           sum(passed) AS passed_total,
           passed_total / decided_total AS pass_rate
    FROM v_domain_quality
    WHERE <FILTERS>
    GROUP BY domain, policy_version
    ORDER BY domain, policy_version
""")

PASS_RATE_BY_VERSION_OVER_TIME = _sql("""
    SELECT <BUCKET> AS time,
           concat('v', toString(policy_version)) AS version,
           sum(passed) / sum(decided) AS pass_rate
    FROM v_domain_quality
    WHERE <FILTERS>
    GROUP BY time, policy_version
    ORDER BY time, policy_version
""")

OPEN_ALERTS = _sql("""
    SELECT domain,
           policy_version,
           baseline_pass_rate,
           candidate_pass_rate,
           `drop` AS pass_rate_drop,
           p_value,
           candidate_decided,
           first_fired_at
    FROM v_alerts
    WHERE state = 'firing'
      AND run_id IN (${run:singlequote})
      AND $__conditionalAll(domain IN (${domain:singlequote}), $domain)
    ORDER BY pass_rate_drop DESC, domain, policy_version
""")

DOMAIN_ALERTS = _sql("""
    SELECT policy_version,
           state,
           baseline_pass_rate,
           candidate_pass_rate,
           `drop` AS pass_rate_drop,
           p_value,
           overall_rose,
           updated_at
    FROM v_alerts
    WHERE run_id IN (${run:singlequote})
      AND $__conditionalAll(domain IN (${domain:singlequote}), $domain)
    ORDER BY policy_version
""")

# -- policy lag ----------------------------------------------------------------------------------

POLICY_LAG = _sql("""
    SELECT <BUCKET> AS time,
           max(lag_versions_p50) AS lag_p50,
           max(lag_versions_p95) AS lag_p95,
           max(staleness_bound) AS bound
    FROM v_policy_lag
    WHERE stage = 'finish'
      AND <FILTERS>
    GROUP BY time
    ORDER BY time
""")

SHARE_OVER_BOUND = _sql("""
    SELECT <BUCKET> AS time,
           stage,
           sum(over_bound) / sum(trajectories) AS over_bound_share
    FROM v_policy_lag
    WHERE <FILTERS>
    GROUP BY time, stage
    ORDER BY time, stage
""")

# -- timing, budget, interruptions, snapshots ----------------------------------------------------

TIMING = _sql("""
    SELECT <BUCKET> AS time,
           max(wait_s_p50) AS wait_p50,
           max(wait_s_p95) AS wait_p95,
           max(run_s_p50) AS run_p50,
           max(run_s_p95) AS run_p95
    FROM v_timing
    WHERE <FILTERS>
    GROUP BY time
    ORDER BY time
""")

BUDGET_SHARE = _sql("""
    SELECT <BUCKET> AS time,
           sumIf(sandbox_seconds, $__conditionalAll(domain IN (${domain:singlequote}), $domain))
               / nullIf(sum(sandbox_seconds), 0) AS sandbox_time_share,
           (
               SELECT sum(domain_weight)
               FROM
               (
                   SELECT domain, max(configured_weight) AS domain_weight
                   FROM v_budget
                   WHERE <FILTERS>
                   GROUP BY domain
               )
           ) AS configured_share
    FROM v_budget
    WHERE run_id IN (${run:singlequote}) AND $__timeFilter(window_start)
    GROUP BY time
    ORDER BY time
""")
"""The selected domains' share of the run's sandbox time per bucket, beside the share their configured weights
ask for. The weights' total is a scalar subquery, computed once: a CROSS JOIN with it cost 36 against 21 ms over
a month of windows (same rows)."""

EFFECTIVE_PER_SANDBOX_HOUR = _sql("""
    SELECT <BUCKET> AS time,
           domain,
           sum(effective) * 3600 / nullIf(sum(sandbox_seconds), 0) AS effective_per_sandbox_h
    FROM v_budget
    WHERE <FILTERS>
    GROUP BY time, domain
    ORDER BY time, domain
""")

INTERRUPTIONS_BY_REASON = _sql("""
    SELECT <BUCKET> AS time,
           reason,
           sum(interruptions) AS reason_interruptions
    FROM v_interruptions
    WHERE <FILTERS>
    GROUP BY time, reason
    ORDER BY time, reason
""")

SNAPSHOTS_AND_RESUMES = _sql("""
    SELECT <BUCKET> AS time,
           sum(snapshots) AS snapshots_taken,
           sum(resumes) AS resumes_total,
           sum(resumes_succeeded) AS resumes_ok
    FROM v_snapshots
    WHERE <FILTERS>
    GROUP BY time
    ORDER BY time
""")

RESUME_SUCCESS = _sql("""
    SELECT <BUCKET> AS time,
           sum(resumes_succeeded) / nullIf(sum(resumes), 0) AS resume_success,
           sum(resumed_passed) / nullIf(sum(resumed_trajectories), 0) AS passed_after_resume
    FROM v_snapshots
    WHERE <FILTERS>
    GROUP BY time
    ORDER BY time
""")

SNAPSHOT_BYTES = _sql("""
    SELECT <BUCKET> AS time,
           domain,
           sum(snapshot_bytes) AS bytes_written
    FROM v_snapshots
    WHERE <FILTERS>
    GROUP BY time, domain
    ORDER BY time, domain
""")

# -- verifier integrity --------------------------------------------------------------------------

DIGEST_MISMATCHES = _sql("""
    SELECT <BUCKET> AS time,
           verifier_version,
           sum(digest_mismatches) AS mismatches
    FROM v_verifier_integrity
    WHERE <FILTERS>
    GROUP BY time, verifier_version
    ORDER BY time, verifier_version
""")

VERDICTS_BY_VERIFIER = _sql("""
    SELECT verifier_version,
           sum(verdicts) AS verdicts_total,
           sum(passed) AS passed_total,
           sum(failed) AS failed_total,
           sum(undecidable) AS undecidable_total,
           sum(errors) AS errors_total,
           sum(digest_mismatches) AS mismatches_total,
           sum(claimed_complete_failed) AS claimed_complete_failed_total,
           mismatches_total / verdicts_total AS mismatch_rate,
           errors_total / verdicts_total AS error_rate
    FROM v_verifier_integrity
    WHERE <FILTERS>
    GROUP BY verifier_version
    ORDER BY verifier_version
""")

VERDICT_OUTCOMES = _sql("""
    SELECT <BUCKET> AS time,
           sum(passed) AS passed_verdicts,
           sum(failed) AS failed_verdicts,
           sum(undecidable) AS undecidable_verdicts,
           sum(errors) AS error_verdicts
    FROM v_verifier_integrity
    WHERE <FILTERS>
    GROUP BY time
    ORDER BY time
""")

CLAIMED_COMPLETE_FAILED = _sql("""
    SELECT <BUCKET> AS time,
           verifier_version,
           sum(claimed_complete_failed) / nullIf(sum(verdicts), 0) AS claimed_complete_failed_share
    FROM v_verifier_integrity
    WHERE <FILTERS>
    GROUP BY time, verifier_version
    ORDER BY time, verifier_version
""")

UNDECIDABLE_REASONS = _sql("""
    SELECT undecidable_reason,
           sum(trajectories) AS trajectories_total,
           trajectories_total / sum(trajectories_total) OVER () AS reason_share
    FROM v_undecidable
    WHERE <FILTERS>
    GROUP BY undecidable_reason
    ORDER BY trajectories_total DESC
""")

# -- alert rules (backend macros only) -----------------------------------------------------------
#
# Each returns one row per alert instance: string columns become the instance's labels (run,
# domain, ...), and exactly one numeric column is the value the rule's reduce and threshold test.
# "Recent" is each run's own last 15 minutes of windows within the range (event time), so a
# replayed or back-filled run is judged like a live one.

ALERT_DOMAIN_REGRESSION = _sql("""
    SELECT run_id AS run,
           domain,
           max(`drop`) AS pass_rate_drop
    FROM v_alerts
    WHERE state = 'firing'
      AND run_id IN (SELECT DISTINCT run_id FROM v_effective_throughput WHERE $__timeFilter(window_start))
    GROUP BY run, domain
""")

ALERT_ENV_FAILURE_SPIKE = _sql("""
    WITH runs AS
    (
        SELECT run_id, max(window_start) AS newest
        FROM v_effective_throughput
        WHERE $__timeFilter(window_start)
        GROUP BY run_id
    ),
    finished AS
    (
        SELECT t.run_id AS run_id, t.domain AS domain,
               sumIf(t.finished, t.window_start > r.newest - INTERVAL 15 MINUTE) AS recent_finished,
               sumIf(t.finished, t.window_start <= r.newest - INTERVAL 15 MINUTE) AS earlier_finished
        FROM v_effective_throughput AS t
        INNER JOIN runs AS r ON t.run_id = r.run_id
        WHERE $__timeFilter(t.window_start)
        GROUP BY run_id, domain
    ),
    failed AS
    (
        SELECT f.run_id AS run_id, f.domain AS domain, f.failure_class AS failure_class,
               sumIf(f.failures, f.window_start > r.newest - INTERVAL 15 MINUTE) AS recent_failures,
               sumIf(f.failures, f.window_start <= r.newest - INTERVAL 15 MINUTE) AS earlier_failures
        FROM v_env_failures AS f
        INNER JOIN runs AS r ON f.run_id = r.run_id
        WHERE f.origin = 'environment' AND $__timeFilter(f.window_start)
        GROUP BY run_id, domain, failure_class
    )
    SELECT failed.run_id AS run,
           failed.domain AS domain,
           failed.failure_class AS failure_class,
           recent_failures / recent_finished
               - if(earlier_finished > 0, earlier_failures / earlier_finished, 0) AS rate_increase
    FROM failed
    INNER JOIN finished ON failed.run_id = finished.run_id AND failed.domain = finished.domain
    WHERE recent_finished >= 20
""")

ALERT_POLICY_LAG = _sql("""
    WITH runs AS
    (
        SELECT run_id, max(window_start) AS newest
        FROM v_policy_lag
        WHERE stage = 'finish' AND $__timeFilter(window_start)
        GROUP BY run_id
    )
    SELECT l.run_id AS run,
           l.domain AS domain,
           quantileExactWeighted(0.5)(l.lag_versions_p95, l.trajectories) - max(l.staleness_bound) AS p95_over_bound
    FROM v_policy_lag AS l
    INNER JOIN runs AS r ON l.run_id = r.run_id
    WHERE l.stage = 'finish'
      AND $__timeFilter(l.window_start)
      AND l.window_start > r.newest - INTERVAL 15 MINUTE
      AND l.lag_versions_p95 IS NOT NULL
    GROUP BY run, domain
""")

ALERT_THROUGHPUT_DROP = _sql("""
    WITH runs AS
    (
        SELECT run_id, min(window_start) AS oldest, max(window_start) AS newest
        FROM v_effective_throughput
        WHERE $__timeFilter(window_start)
        GROUP BY run_id
    ),
    rates AS
    (
        SELECT t.run_id AS run_id, t.domain AS domain,
               sumIf(t.effective, t.window_start >= r.newest - INTERVAL 15 MINUTE AND t.window_start < r.newest)
                   / 900 AS recent_rate,
               sumIf(t.effective, t.window_start >= r.newest - INTERVAL 75 MINUTE
                                  AND t.window_start < r.newest - INTERVAL 15 MINUTE) AS baseline_effective,
               dateDiff('second', greatest(any(r.oldest), any(r.newest) - INTERVAL 75 MINUTE),
                        any(r.newest) - INTERVAL 15 MINUTE) AS baseline_seconds
        FROM v_effective_throughput AS t
        INNER JOIN runs AS r ON t.run_id = r.run_id
        WHERE $__timeFilter(t.window_start)
        GROUP BY run_id, domain
    )
    SELECT run_id AS run,
           domain,
           recent_rate / (baseline_effective / baseline_seconds) AS recent_to_baseline
    FROM rates
    WHERE baseline_seconds >= 1800 AND baseline_effective >= 30
""")

ALERT_DIGEST_MISMATCHES = _sql("""
    WITH runs AS
    (
        SELECT run_id, max(window_start) AS newest
        FROM v_verifier_integrity
        WHERE $__timeFilter(window_start)
        GROUP BY run_id
    )
    SELECT v.run_id AS run,
           v.domain AS domain,
           v.verifier_version AS verifier_version,
           toFloat64(sum(v.digest_mismatches)) AS mismatches
    FROM v_verifier_integrity AS v
    INNER JOIN runs AS r ON v.run_id = r.run_id
    WHERE $__timeFilter(v.window_start)
      AND v.window_start > r.newest - INTERVAL 15 MINUTE
    GROUP BY run, domain, verifier_version
""")
