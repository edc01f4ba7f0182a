-- The views of the families with several rows per window ARRAY JOIN the Nested subcolumns one by one
-- instead of the Nested column as a whole. Same columns, types, order and rows (0003's definitions
-- otherwise).
--
-- With `ARRAY JOIN policy_lag AS l` the engine unfolds every subcolumn of the Nested column for
-- every row as soon as a query filters on one of them, whatever the query reads: counting the
-- 'finish' rows of v_policy_lag over a month of windows (172,800 rows, bench data) took 44 ms
-- against 13 ms for all rows. Named one by one, the subcolumns a query does not use are left out:
-- that count took 18 ms, and the "Policy lag at finish" panel over the month 31 ms against 65 ms.
-- tests/integration/test_clickhouse_window_store.py holds every view to 0003's definition on the
-- same data.
--
-- The ARRAY JOIN aliases carry a prefix of their own: several subcolumns share their name with a
-- column of the table (finished, passed, decided, interruptions, ...), and the view's output names
-- stay those of 0003. Needs CREATE VIEW and DROP VIEW, which the worker's role has.

CREATE OR REPLACE VIEW {db}.v_env_failures AS
SELECT run_id, domain, window_start, window_end,
       aj_origin AS origin, aj_failure_class AS failure_class, aj_environment_version AS environment_version,
       aj_failures AS failures, aj_finished AS finished,
       if(aj_finished > 0, aj_failures / aj_finished, NULL) AS failure_rate
FROM {db}.m_window_metrics FINAL
ARRAY JOIN env_failures.origin AS aj_origin, env_failures.failure_class AS aj_failure_class,
           env_failures.environment_version AS aj_environment_version, env_failures.failures AS aj_failures,
           env_failures.finished AS aj_finished;

CREATE OR REPLACE VIEW {db}.v_domain_quality AS
SELECT run_id, domain, window_start, window_end, aj_policy_version AS policy_version,
       aj_decided AS decided, aj_passed AS passed, aj_decided - aj_passed AS failed,
       if(aj_decided > 0, aj_passed / aj_decided, NULL) AS pass_rate
FROM {db}.m_window_metrics FINAL
ARRAY JOIN quality.policy_version AS aj_policy_version, quality.decided AS aj_decided,
           quality.passed AS aj_passed;

CREATE OR REPLACE VIEW {db}.v_policy_lag AS
SELECT run_id, domain, window_start, window_end, aj_stage AS stage, aj_trajectories AS trajectories,
       aj_lag_versions_p50 AS lag_versions_p50, aj_lag_versions_p95 AS lag_versions_p95,
       aj_lag_versions_max AS lag_versions_max,
       aj_lag_seconds_p50 AS lag_seconds_p50, aj_lag_seconds_p95 AS lag_seconds_p95,
       aj_lag_seconds_max AS lag_seconds_max,
       aj_over_bound AS over_bound, aj_staleness_bound AS staleness_bound,
       if(aj_trajectories > 0, aj_over_bound / aj_trajectories, NULL) AS share_over_bound
FROM {db}.m_window_metrics FINAL
ARRAY JOIN policy_lag.stage AS aj_stage, policy_lag.trajectories AS aj_trajectories,
           policy_lag.lag_versions_p50 AS aj_lag_versions_p50, policy_lag.lag_versions_p95 AS aj_lag_versions_p95,
           policy_lag.lag_versions_max AS aj_lag_versions_max,
           policy_lag.lag_seconds_p50 AS aj_lag_seconds_p50, policy_lag.lag_seconds_p95 AS aj_lag_seconds_p95,
           policy_lag.lag_seconds_max AS aj_lag_seconds_max,
           policy_lag.over_bound AS aj_over_bound, policy_lag.staleness_bound AS aj_staleness_bound;

CREATE OR REPLACE VIEW {db}.v_interruptions AS
SELECT run_id, domain, window_start, window_end, aj_reason AS reason, aj_interruptions AS interruptions
FROM {db}.m_window_metrics FINAL
ARRAY JOIN interruptions_by_reason.reason AS aj_reason, interruptions_by_reason.interruptions AS aj_interruptions;

CREATE OR REPLACE VIEW {db}.v_verifier_integrity AS
SELECT run_id, domain, window_start, window_end, aj_verifier_version AS verifier_version,
       aj_verdicts AS verdicts, aj_passed AS passed, aj_failed AS failed, aj_undecidable AS undecidable,
       aj_errors AS errors, aj_digest_mismatches AS digest_mismatches,
       aj_claimed_complete_failed AS claimed_complete_failed
FROM {db}.m_window_metrics FINAL
ARRAY JOIN verifier_integrity.verifier_version AS aj_verifier_version, verifier_integrity.verdicts AS aj_verdicts,
           verifier_integrity.passed AS aj_passed, verifier_integrity.failed AS aj_failed,
           verifier_integrity.undecidable AS aj_undecidable, verifier_integrity.errors AS aj_errors,
           verifier_integrity.digest_mismatches AS aj_digest_mismatches,
           verifier_integrity.claimed_complete_failed AS aj_claimed_complete_failed;

CREATE OR REPLACE VIEW {db}.v_undecidable AS
SELECT run_id, domain, window_start, window_end, aj_undecidable_reason AS undecidable_reason,
       aj_trajectories AS trajectories
FROM {db}.m_window_metrics FINAL
ARRAY JOIN undecidable_reasons.undecidable_reason AS aj_undecidable_reason,
           undecidable_reasons.trajectories AS aj_trajectories;

CREATE OR REPLACE VIEW {db}.v_environment_versions AS
SELECT run_id, domain, window_start, window_end, aj_environment_version AS environment_version,
       aj_finished AS finished, aj_env_failed AS env_failed,
       if(aj_finished > 0, aj_env_failed / aj_finished, NULL) AS env_failure_rate
FROM {db}.m_window_metrics FINAL
ARRAY JOIN environment_versions.environment_version AS aj_environment_version,
           environment_versions.finished AS aj_finished, environment_versions.env_failed AS aj_env_failed;
