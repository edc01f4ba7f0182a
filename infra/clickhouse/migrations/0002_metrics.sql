-- Derived data: trajectory records, consumptions, metric windows, alerts, and the SQL contract views.
--
-- Metric windows are recomputed whole (never incremented). Every recompute of a window writes all of
-- its rows with one new version and records that version in m_windows; the v_* views show only the
-- rows of each window's newest version, so a class or policy version that left a window leaves the
-- view too. No reader needs FINAL.

CREATE TABLE IF NOT EXISTS {db}.trajectories
(
    run_id                LowCardinality(String),
    domain                LowCardinality(String),
    finish_window         DateTime('UTC'),          -- window of finished_at; 1970-01-01 while unfinished
    trajectory_id         String,
    task_id               String,
    attempt               UInt32,
    environment_version   LowCardinality(String),
    status                LowCardinality(String),   -- queued | running | finished | superseded (moved window)
    sandbox_id            String,
    policy_version        Nullable(UInt32),
    oldest_policy_version Nullable(UInt32),
    newest_policy_version Nullable(UInt32),
    queued_at             Nullable(DateTime64(6, 'UTC')),
    started_at            Nullable(DateTime64(6, 'UTC')),
    finished_at           Nullable(DateTime64(6, 'UTC')),
    wait_s                Nullable(Float64),
    run_s                 Nullable(Float64),
    termination           LowCardinality(String),
    steps                 UInt64,
    tokens                UInt64,
    artifact_digest       String,
    env_failed            Bool,
    failure_class         LowCardinality(String),
    failure_origin        LowCardinality(String),
    failures              UInt32,
    model_error           Bool,
    verdict               LowCardinality(String),
    verifier_id           String,
    verifier_version      LowCardinality(String),
    verified_digest       String,
    verdict_at            Nullable(DateTime64(6, 'UTC')),
    reward                Nullable(Float64),
    digest_match          Bool,
    decided               Bool,
    passed                Bool,
    undecidable_reason    LowCardinality(String),
    claimed_complete      Bool,
    lag_versions          Nullable(UInt32),
    lag_seconds           Nullable(Float64),
    snapshots             UInt32,
    snapshot_bytes        UInt64,
    resumes               UInt32,
    resumes_succeeded     UInt32,
    steps_restored        UInt64,
    interruptions         UInt32,
    interruption_reasons  Array(LowCardinality(String)),
    revision              UInt32,
    version               UInt64,
    INDEX idx_trajectory trajectory_id TYPE bloom_filter GRANULARITY 4
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (run_id, domain, finish_window, trajectory_id);

CREATE TABLE IF NOT EXISTS {db}.consumptions
(
    run_id          LowCardinality(String),
    trajectory_id   String,
    batch_id        String,
    trainer_version UInt32,
    consumed_at     DateTime64(6, 'UTC'),
    INDEX idx_consumed consumed_at TYPE minmax GRANULARITY 1
)
ENGINE = ReplacingMergeTree
ORDER BY (run_id, trajectory_id, batch_id);

CREATE TABLE IF NOT EXISTS {db}.m_windows
(
    run_id       LowCardinality(String),
    domain       LowCardinality(String),
    window_start DateTime('UTC'),
    window_end   DateTime('UTC'),
    version      UInt64
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (run_id, domain, window_start);

CREATE TABLE IF NOT EXISTS {db}.m_throughput
(
    run_id LowCardinality(String), domain LowCardinality(String),
    window_start DateTime('UTC'), window_end DateTime('UTC'),
    finished UInt64, env_valid UInt64, decided UInt64, passed UInt64, undecidable UInt64,
    digest_mismatches UInt64, model_errors UInt64,
    version UInt64
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (run_id, domain, window_start);

CREATE TABLE IF NOT EXISTS {db}.m_env_failures
(
    run_id LowCardinality(String), domain LowCardinality(String),
    window_start DateTime('UTC'), window_end DateTime('UTC'),
    origin LowCardinality(String), failure_class LowCardinality(String),
    environment_version LowCardinality(String),
    failures UInt64, finished UInt64,
    version UInt64
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (run_id, domain, window_start, origin, failure_class, environment_version);

CREATE TABLE IF NOT EXISTS {db}.m_domain_quality
(
    run_id LowCardinality(String), domain LowCardinality(String),
    window_start DateTime('UTC'), window_end DateTime('UTC'),
    policy_version UInt32, decided UInt64, passed UInt64,
    version UInt64
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (run_id, domain, window_start, policy_version);

CREATE TABLE IF NOT EXISTS {db}.m_policy_lag
(
    run_id LowCardinality(String), domain LowCardinality(String),
    window_start DateTime('UTC'), window_end DateTime('UTC'),
    stage LowCardinality(String),
    trajectories UInt64,
    lag_versions_p50 Nullable(Float64), lag_versions_p95 Nullable(Float64), lag_versions_max Nullable(Float64),
    lag_seconds_p50 Nullable(Float64), lag_seconds_p95 Nullable(Float64), lag_seconds_max Nullable(Float64),
    over_bound UInt64, staleness_bound UInt32,
    version UInt64
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (run_id, domain, window_start, stage);

CREATE TABLE IF NOT EXISTS {db}.m_timing
(
    run_id LowCardinality(String), domain LowCardinality(String),
    window_start DateTime('UTC'), window_end DateTime('UTC'),
    finished UInt64,
    wait_s_p50 Nullable(Float64), wait_s_p95 Nullable(Float64),
    run_s_p50 Nullable(Float64), run_s_p95 Nullable(Float64),
    interruptions UInt64,
    version UInt64
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (run_id, domain, window_start);

CREATE TABLE IF NOT EXISTS {db}.m_interruptions
(
    run_id LowCardinality(String), domain LowCardinality(String),
    window_start DateTime('UTC'), window_end DateTime('UTC'),
    reason LowCardinality(String), interruptions UInt64,
    version UInt64
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (run_id, domain, window_start, reason);

CREATE TABLE IF NOT EXISTS {db}.m_budget
(
    run_id LowCardinality(String), domain LowCardinality(String),
    window_start DateTime('UTC'), window_end DateTime('UTC'),
    sandbox_seconds Float64, effective UInt64, configured_weight Float64,
    version UInt64
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (run_id, domain, window_start);

CREATE TABLE IF NOT EXISTS {db}.m_snapshots
(
    run_id LowCardinality(String), domain LowCardinality(String),
    window_start DateTime('UTC'), window_end DateTime('UTC'),
    snapshots UInt64, snapshot_bytes UInt64, resumes UInt64, resumes_succeeded UInt64,
    steps_restored UInt64, resumed_trajectories UInt64, resumed_passed UInt64,
    version UInt64
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (run_id, domain, window_start);

CREATE TABLE IF NOT EXISTS {db}.m_verifier_integrity
(
    run_id LowCardinality(String), domain LowCardinality(String),
    window_start DateTime('UTC'), window_end DateTime('UTC'),
    verifier_version LowCardinality(String),
    verdicts UInt64, passed UInt64, failed UInt64, undecidable UInt64, errors UInt64,
    digest_mismatches UInt64, claimed_complete_failed UInt64,
    version UInt64
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (run_id, domain, window_start, verifier_version);

CREATE TABLE IF NOT EXISTS {db}.alerts
(
    alert_id                    String,
    run_id                      LowCardinality(String),
    domain                      LowCardinality(String),
    policy_version              UInt32,
    state                       LowCardinality(String),  -- firing | resolved
    baseline_versions           Array(UInt32),
    baseline_decided            UInt64,
    baseline_passed             UInt64,
    baseline_pass_rate          Float64,
    candidate_decided           UInt64,
    candidate_passed            UInt64,
    candidate_pass_rate         Float64,
    drop                        Float64,
    z                           Float64,
    p_value                     Float64,
    overall_baseline_pass_rate  Nullable(Float64),
    overall_candidate_pass_rate Nullable(Float64),
    overall_rose                Bool,
    first_fired_at              DateTime64(3, 'UTC'),
    updated_at                  DateTime64(3, 'UTC'),
    version                     UInt64
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (run_id, domain, policy_version);

CREATE VIEW IF NOT EXISTS {db}.v_windows AS
SELECT run_id, domain, window_start, max(version) AS version
FROM {db}.m_windows
GROUP BY run_id, domain, window_start;

CREATE VIEW IF NOT EXISTS {db}.v_effective_throughput AS
SELECT run_id, domain, window_start, window_end,
       finished, env_valid, decided, decided AS effective, passed, undecidable, digest_mismatches, model_errors,
       if(finished > 0, env_valid / finished, NULL) AS env_validity_rate,
       if(env_valid > 0, decided / env_valid, NULL) AS decidable_ratio,
       finished * 3600 / dateDiff('second', window_start, window_end) AS finished_per_hour,
       decided * 3600 / dateDiff('second', window_start, window_end) AS effective_per_hour
FROM {db}.m_throughput
WHERE (run_id, domain, window_start, version) IN (SELECT run_id, domain, window_start, version FROM {db}.v_windows);

CREATE VIEW IF NOT EXISTS {db}.v_env_failures AS
SELECT run_id, domain, window_start, window_end, origin, failure_class, environment_version,
       failures, finished, if(finished > 0, failures / finished, NULL) AS failure_rate
FROM {db}.m_env_failures
WHERE (run_id, domain, window_start, version) IN (SELECT run_id, domain, window_start, version FROM {db}.v_windows);

CREATE VIEW IF NOT EXISTS {db}.v_domain_quality AS
SELECT run_id, domain, window_start, window_end, policy_version,
       decided, passed, decided - passed AS failed, if(decided > 0, passed / decided, NULL) AS pass_rate
FROM {db}.m_domain_quality
WHERE (run_id, domain, window_start, version) IN (SELECT run_id, domain, window_start, version FROM {db}.v_windows);

CREATE VIEW IF NOT EXISTS {db}.v_policy_lag AS
SELECT run_id, domain, window_start, window_end, stage, trajectories,
       lag_versions_p50, lag_versions_p95, lag_versions_max,
       lag_seconds_p50, lag_seconds_p95, lag_seconds_max,
       over_bound, staleness_bound, if(trajectories > 0, over_bound / trajectories, NULL) AS share_over_bound
FROM {db}.m_policy_lag
WHERE (run_id, domain, window_start, version) IN (SELECT run_id, domain, window_start, version FROM {db}.v_windows);

CREATE VIEW IF NOT EXISTS {db}.v_timing AS
SELECT run_id, domain, window_start, window_end, finished, wait_s_p50, wait_s_p95, run_s_p50, run_s_p95, interruptions
FROM {db}.m_timing
WHERE (run_id, domain, window_start, version) IN (SELECT run_id, domain, window_start, version FROM {db}.v_windows);

CREATE VIEW IF NOT EXISTS {db}.v_interruptions AS
SELECT run_id, domain, window_start, window_end, reason, interruptions
FROM {db}.m_interruptions
WHERE (run_id, domain, window_start, version) IN (SELECT run_id, domain, window_start, version FROM {db}.v_windows);

CREATE VIEW IF NOT EXISTS {db}.v_budget AS
SELECT run_id, domain, window_start, window_end, sandbox_seconds, effective, configured_weight,
       if(sum(sandbox_seconds) OVER (PARTITION BY run_id, window_start) > 0,
          sandbox_seconds / sum(sandbox_seconds) OVER (PARTITION BY run_id, window_start), NULL) AS sandbox_share,
       if(sandbox_seconds > 0, effective * 3600 / sandbox_seconds, NULL) AS effective_per_sandbox_hour
FROM {db}.m_budget
WHERE (run_id, domain, window_start, version) IN (SELECT run_id, domain, window_start, version FROM {db}.v_windows);

CREATE VIEW IF NOT EXISTS {db}.v_snapshots AS
SELECT run_id, domain, window_start, window_end, snapshots, snapshot_bytes, resumes, resumes_succeeded,
       if(resumes > 0, resumes_succeeded / resumes, NULL) AS resume_success_rate,
       steps_restored, resumed_trajectories, resumed_passed
FROM {db}.m_snapshots
WHERE (run_id, domain, window_start, version) IN (SELECT run_id, domain, window_start, version FROM {db}.v_windows);

CREATE VIEW IF NOT EXISTS {db}.v_verifier_integrity AS
SELECT run_id, domain, window_start, window_end, verifier_version, verdicts, passed, failed, undecidable, errors,
       digest_mismatches, claimed_complete_failed
FROM {db}.m_verifier_integrity
WHERE (run_id, domain, window_start, version) IN (SELECT run_id, domain, window_start, version FROM {db}.v_windows);

CREATE VIEW IF NOT EXISTS {db}.v_alerts AS
SELECT alert_id, run_id, domain, policy_version, state, baseline_versions,
       baseline_decided, baseline_passed, baseline_pass_rate,
       candidate_decided, candidate_passed, candidate_pass_rate, drop, z, p_value,
       overall_baseline_pass_rate, overall_candidate_pass_rate, overall_rose, first_fired_at, updated_at
FROM {db}.alerts
ORDER BY version DESC
LIMIT 1 BY run_id, domain, policy_version;

CREATE VIEW IF NOT EXISTS {db}.v_trajectories AS
SELECT * EXCEPT (finish_window, version)
FROM
(
    SELECT * FROM {db}.trajectories ORDER BY version DESC LIMIT 1 BY run_id, trajectory_id
)
WHERE status != 'superseded'
