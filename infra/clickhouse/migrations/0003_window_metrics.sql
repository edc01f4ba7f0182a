-- Metric windows in one wide table: one row per (run_id, domain, window_start) holding every metric
-- family of the window, replacing the nine m_* family tables and m_windows of 0002.
--
-- A recompute of a window writes one new row with a new version. Families with one row per window
-- are plain columns; families with several rows per window (failures by origin, class and environment
-- version; quality by policy version; lag by stage; interruptions by reason; integrity by verifier
-- version; undecidable trajectories by reason; finished trajectories by environment version) are
-- Nested columns, that is parallel arrays. A row is written whole by one INSERT, so a reader sees
-- either the previous or the new version of a window, never a mix of the two, and a class or policy
-- version that left a window leaves with the old row. The views read the newest row of each window
-- with FINAL; filters on run_id, window_start and domain narrow the read through the primary key.
--
-- v_trajectories reads trajectories_latest: the rows of trajectories, copied on insert by a materialized
-- view, in a ReplacingMergeTree ordered by (run_id, trajectory_id), so FINAL keeps the newest record
-- of each trajectory (it used to sort every record of the table by version on each read). It is
-- created with the structure of trajectories; a later migration that adds a column to trajectories
-- adds it to trajectories_latest too (the materialized view copies SELECT *).
--
-- The sorting key starts with the time after the run: the worker's inserts hold recent windows of
-- every domain, so they overlap only the newest end of the merged data, and FINAL merges little.
--
-- Upgrading a database where 0002 was applied drops the old metric tables and their rows. Metric
-- windows are derived data: replay the raw log into the database (a worker on a fresh consumer
-- group) to rebuild them; trajectories, consumptions, alerts and raw events are kept (trajectories_latest
-- is filled from trajectories here). On a ClickHouse
-- server, run `rollout infra clickhouse-users` again first: the worker's role needs DROP TABLE and
-- DROP VIEW for this migration.

DROP VIEW IF EXISTS {db}.v_windows;
DROP VIEW IF EXISTS {db}.v_effective_throughput;
DROP VIEW IF EXISTS {db}.v_env_failures;
DROP VIEW IF EXISTS {db}.v_domain_quality;
DROP VIEW IF EXISTS {db}.v_policy_lag;
DROP VIEW IF EXISTS {db}.v_timing;
DROP VIEW IF EXISTS {db}.v_interruptions;
DROP VIEW IF EXISTS {db}.v_budget;
DROP VIEW IF EXISTS {db}.v_snapshots;
DROP VIEW IF EXISTS {db}.v_verifier_integrity;
DROP VIEW IF EXISTS {db}.v_undecidable;
DROP VIEW IF EXISTS {db}.v_environment_versions;

DROP TABLE IF EXISTS {db}.m_windows;
DROP TABLE IF EXISTS {db}.m_throughput;
DROP TABLE IF EXISTS {db}.m_env_failures;
DROP TABLE IF EXISTS {db}.m_domain_quality;
DROP TABLE IF EXISTS {db}.m_policy_lag;
DROP TABLE IF EXISTS {db}.m_timing;
DROP TABLE IF EXISTS {db}.m_interruptions;
DROP TABLE IF EXISTS {db}.m_budget;
DROP TABLE IF EXISTS {db}.m_snapshots;
DROP TABLE IF EXISTS {db}.m_verifier_integrity;

CREATE TABLE IF NOT EXISTS {db}.m_window_metrics
(
    run_id       LowCardinality(String),
    domain       LowCardinality(String),
    window_start DateTime('UTC'),
    window_end   DateTime('UTC'),
    -- throughput
    finished UInt64, env_valid UInt64, decided UInt64, passed UInt64, undecidable UInt64,
    digest_mismatches UInt64, model_errors UInt64,
    -- timing (timing_finished is the family's own count of finished trajectories)
    timing_finished UInt64,
    wait_s_p50 Nullable(Float64), wait_s_p95 Nullable(Float64),
    run_s_p50 Nullable(Float64), run_s_p95 Nullable(Float64),
    interruptions UInt64,
    -- budget
    sandbox_seconds Float64, effective UInt64, configured_weight Float64,
    -- snapshots
    snapshots UInt64, snapshot_bytes UInt64, resumes UInt64, resumes_succeeded UInt64,
    steps_restored UInt64, resumed_trajectories UInt64, resumed_passed UInt64,
    -- families with several rows per window
    env_failures Nested
    (
        origin LowCardinality(String), failure_class LowCardinality(String),
        environment_version LowCardinality(String), failures UInt64, finished UInt64
    ),
    quality Nested
    (
        policy_version UInt32, decided UInt64, passed UInt64
    ),
    policy_lag Nested
    (
        stage LowCardinality(String), trajectories UInt64,
        lag_versions_p50 Nullable(Float64), lag_versions_p95 Nullable(Float64), lag_versions_max Nullable(Float64),
        lag_seconds_p50 Nullable(Float64), lag_seconds_p95 Nullable(Float64), lag_seconds_max Nullable(Float64),
        over_bound UInt64, staleness_bound UInt32
    ),
    interruptions_by_reason Nested
    (
        reason LowCardinality(String), interruptions UInt64
    ),
    verifier_integrity Nested
    (
        verifier_version LowCardinality(String), verdicts UInt64, passed UInt64, failed UInt64,
        undecidable UInt64, errors UInt64, digest_mismatches UInt64, claimed_complete_failed UInt64
    ),
    undecidable_reasons Nested
    (
        undecidable_reason LowCardinality(String), trajectories UInt64
    ),
    environment_versions Nested
    (
        environment_version LowCardinality(String), finished UInt64, env_failed UInt64
    ),
    version UInt64
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (run_id, window_start, domain);

CREATE VIEW IF NOT EXISTS {db}.v_windows AS
SELECT run_id, domain, window_start, version
FROM {db}.m_window_metrics FINAL;

CREATE VIEW IF NOT EXISTS {db}.v_effective_throughput AS
SELECT run_id, domain, window_start, window_end,
       finished, env_valid, decided, decided AS effective, passed, undecidable, digest_mismatches, model_errors,
       if(finished > 0, env_valid / finished, NULL) AS env_validity_rate,
       if(env_valid > 0, decided / env_valid, NULL) AS decidable_ratio,
       finished * 3600 / dateDiff('second', window_start, window_end) AS finished_per_hour,
       decided * 3600 / dateDiff('second', window_start, window_end) AS effective_per_hour
FROM {db}.m_window_metrics FINAL;

CREATE VIEW IF NOT EXISTS {db}.v_env_failures AS
SELECT run_id, domain, window_start, window_end,
       f.origin AS origin, f.failure_class AS failure_class, f.environment_version AS environment_version,
       f.failures AS failures, f.finished AS finished,
       if(f.finished > 0, f.failures / f.finished, NULL) AS failure_rate
FROM {db}.m_window_metrics FINAL
ARRAY JOIN env_failures AS f;

CREATE VIEW IF NOT EXISTS {db}.v_domain_quality AS
SELECT run_id, domain, window_start, window_end, q.policy_version AS policy_version,
       q.decided AS decided, q.passed AS passed, q.decided - q.passed AS failed,
       if(q.decided > 0, q.passed / q.decided, NULL) AS pass_rate
FROM {db}.m_window_metrics FINAL
ARRAY JOIN quality AS q;

CREATE VIEW IF NOT EXISTS {db}.v_policy_lag AS
SELECT run_id, domain, window_start, window_end, l.stage AS stage, l.trajectories AS trajectories,
       l.lag_versions_p50 AS lag_versions_p50, l.lag_versions_p95 AS lag_versions_p95,
       l.lag_versions_max AS lag_versions_max,
       l.lag_seconds_p50 AS lag_seconds_p50, l.lag_seconds_p95 AS lag_seconds_p95,
       l.lag_seconds_max AS lag_seconds_max,
       l.over_bound AS over_bound, l.staleness_bound AS staleness_bound,
       if(l.trajectories > 0, l.over_bound / l.trajectories, NULL) AS share_over_bound
FROM {db}.m_window_metrics FINAL
ARRAY JOIN policy_lag AS l;

CREATE VIEW IF NOT EXISTS {db}.v_timing AS
SELECT run_id, domain, window_start, window_end, timing_finished AS finished,
       wait_s_p50, wait_s_p95, run_s_p50, run_s_p95, interruptions
FROM {db}.m_window_metrics FINAL;

CREATE VIEW IF NOT EXISTS {db}.v_interruptions AS
SELECT run_id, domain, window_start, window_end, i.reason AS reason, i.interruptions AS interruptions
FROM {db}.m_window_metrics FINAL
ARRAY JOIN interruptions_by_reason AS i;

CREATE VIEW IF NOT EXISTS {db}.v_budget AS
SELECT run_id, domain, window_start, window_end, sandbox_seconds, effective, configured_weight,
       if(sum(sandbox_seconds) OVER (PARTITION BY run_id, window_start) > 0,
          sandbox_seconds / sum(sandbox_seconds) OVER (PARTITION BY run_id, window_start), NULL) AS sandbox_share,
       if(sandbox_seconds > 0, effective * 3600 / sandbox_seconds, NULL) AS effective_per_sandbox_hour
FROM {db}.m_window_metrics FINAL;

CREATE VIEW IF NOT EXISTS {db}.v_snapshots AS
SELECT run_id, domain, window_start, window_end, snapshots, snapshot_bytes, resumes, resumes_succeeded,
       if(resumes > 0, resumes_succeeded / resumes, NULL) AS resume_success_rate,
       steps_restored, resumed_trajectories, resumed_passed
FROM {db}.m_window_metrics FINAL;

CREATE VIEW IF NOT EXISTS {db}.v_verifier_integrity AS
SELECT run_id, domain, window_start, window_end, v.verifier_version AS verifier_version,
       v.verdicts AS verdicts, v.passed AS passed, v.failed AS failed, v.undecidable AS undecidable,
       v.errors AS errors, v.digest_mismatches AS digest_mismatches,
       v.claimed_complete_failed AS claimed_complete_failed
FROM {db}.m_window_metrics FINAL
ARRAY JOIN verifier_integrity AS v;

CREATE VIEW IF NOT EXISTS {db}.v_undecidable AS
SELECT run_id, domain, window_start, window_end, u.undecidable_reason AS undecidable_reason,
       u.trajectories AS trajectories
FROM {db}.m_window_metrics FINAL
ARRAY JOIN undecidable_reasons AS u;

CREATE VIEW IF NOT EXISTS {db}.v_environment_versions AS
SELECT run_id, domain, window_start, window_end, e.environment_version AS environment_version,
       e.finished AS finished, e.env_failed AS env_failed,
       if(e.finished > 0, e.env_failed / e.finished, NULL) AS env_failure_rate
FROM {db}.m_window_metrics FINAL
ARRAY JOIN environment_versions AS e;

-- The structure of trajectories, sorted for lookups by trajectory.
CREATE TABLE IF NOT EXISTS {db}.trajectories_latest AS {db}.trajectories
ENGINE = ReplacingMergeTree(version)
ORDER BY (run_id, trajectory_id);

CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.trajectories_latest_mv TO {db}.trajectories_latest AS
SELECT * FROM {db}.trajectories;

-- Records written before this migration (run again after a failure, it adds copies with the same
-- version, which FINAL and merges fold into one).
INSERT INTO {db}.trajectories_latest SELECT * FROM {db}.trajectories;

DROP VIEW IF EXISTS {db}.v_trajectories;

CREATE VIEW IF NOT EXISTS {db}.v_trajectories AS
SELECT * EXCEPT (finish_window, version)
FROM {db}.trajectories_latest FINAL
WHERE status != 'superseded'
