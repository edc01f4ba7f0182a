-- Trajectory assembly re-implemented in SQL on the raw events of one run: the common table
-- expressions every audit query starts with. It follows the rules of the spec (DESIGN.md
-- "Metric definitions"), not the stream's code:
--   * events are deduplicated by event_id and ordered by (event time, event id); the event time is
--     the payload's occurred_at at full (microsecond) precision;
--   * the queued and started events are the first ones, the finish event the last one;
--   * the verdict is the latest one within the verdict timeout after the finish, else the latest;
--   * decided = finished, no environment-origin failure, verdict passed/failed, verified digest
--     equal to the final artifact digest (not empty), verdict within the timeout; a finished,
--     environment-valid trajectory that is not decided has the first reason of: no verdict, verdict
--     undecidable, verifier error, verdict late, digest mismatch;
--   * lag at finish = newest version published at the finish − oldest version used; lag in
--     seconds = finish − publication of the first newer version (0 when none);
--   * a trajectory belongs to the window of its finish, a consumption to the window of the
--     batch_consumed event, in the domain of the consumed trajectory.
-- No JOIN (ARRAY JOIN aside): in ClickHouse 26.9 a join's runtime filter can leave a wrong entry in
-- the query condition cache, which then silently truncates later reads with the same filter (run_id = ...).
-- Parameters: {run:String}, {window_s:UInt32}, {timeout_s:Float64}, {timeout_us:Int64},
-- {default_bound:UInt32}; {tid_from:String} and {tid_to:String} ('' and '': every trajectory) limit
-- `raw` and `folded` to the trajectory ids in [tid_from, tid_to) (tid_to '': no upper bound; the events
-- without a trajectory are in the part that starts at ''), so that a bulk replay can fold a large run
-- part by part (streams.replay.trajectory_parts).
WITH
raw AS (
    SELECT
        JSONExtractString(payload, 'event_type') AS type,
        JSONExtractString(payload, 'trajectory_id') AS tid,
        toString(event_id) AS eid,
        toUnixTimestamp64Micro(parseDateTime64BestEffort(JSONExtractString(payload, 'occurred_at'), 6, 'UTC')) AS us,
        payload,
        -- the fields `folded` reads, taken out of the payload in one parse (a missing field is its
        -- type's default, as with JSONExtractString/UInt/Bool, which parsed the payload once per field)
        JSONExtract(payload, 'Tuple(domain String, task_id String, attempt UInt64, environment_version String,
            policy_version UInt64, termination String, artifact_digest String, oldest_policy_version UInt64,
            newest_policy_version UInt64, origin String, failure_class String, verdict String,
            verifier_version String, bytes UInt64, succeeded Bool, steps_restored UInt64, reason String,
            sandbox_id String, steps UInt64, tokens UInt64, verifier_id String, reward Nullable(Float64))') AS j
    FROM events_raw
    WHERE run_id = {run:String}
      -- a part of the run's trajectories (all when both are ''): the column holds the payload's trajectory_id
      AND trajectory_id >= {tid_from:String} AND ({tid_to:String} = '' OR trajectory_id < {tid_to:String})
    LIMIT 1 BY event_id
),
published AS (
    -- first publication time of each policy version
    SELECT toInt64(JSONExtractUInt(payload, 'version')) AS v, min(us) AS t
    FROM raw
    WHERE type = 'policy.version_published'
    GROUP BY v
),
(SELECT groupArray(v) FROM published) AS tl_versions,
(SELECT groupArray(t) FROM published) AS tl_times,
config AS (
    -- the latest run configuration (defaults when the run never declared one)
    SELECT
        count() > 0 AS configured,
        argMax(payload, (us, eid)) AS latest,
        toInt64(if(configured, JSONExtractUInt(latest, 'staleness_bound'), {default_bound:UInt32})) AS staleness_bound,
        JSONExtract(if(configured, latest, '{}'), 'domain_weights', 'Map(String, Float64)') AS weights,
        arraySum(mapValues(weights)) AS weights_total
    FROM raw
    WHERE type = 'policy.run_configured'
),
(SELECT staleness_bound FROM config) AS run_staleness_bound,
(SELECT weights FROM config) AS run_weights,
(SELECT weights_total FROM config) AS run_weights_total,
folded AS (
    -- one row per trajectory: what each kind of event contributes
    SELECT
        tid,
        count() AS revision,
        argMin(j.domain, (us, eid)) AS first_domain,

        countIf(type = 'sandbox.rollout_queued') > 0 AS has_q,
        argMinIf(us, (us, eid), type = 'sandbox.rollout_queued') AS q_us,
        argMinIf(j.domain, (us, eid), type = 'sandbox.rollout_queued') AS q_domain,
        argMinIf(j.task_id, (us, eid), type = 'sandbox.rollout_queued') AS q_task,
        argMinIf(j.attempt, (us, eid), type = 'sandbox.rollout_queued') AS q_attempt,
        argMinIf(j.environment_version, (us, eid), type = 'sandbox.rollout_queued') AS q_environment,

        countIf(type = 'sandbox.rollout_started') > 0 AS has_s,
        argMinIf(us, (us, eid), type = 'sandbox.rollout_started') AS s_us,
        toInt64(argMinIf(j.policy_version, (us, eid), type = 'sandbox.rollout_started')) AS s_policy,
        argMinIf(j.sandbox_id, (us, eid), type = 'sandbox.rollout_started') AS s_sandbox,

        countIf(type = 'sandbox.rollout_finished') > 0 AS has_f,
        argMaxIf(us, (us, eid), type = 'sandbox.rollout_finished') AS f_us,
        argMaxIf(j.termination, (us, eid), type = 'sandbox.rollout_finished') AS f_termination,
        argMaxIf(j.artifact_digest, (us, eid), type = 'sandbox.rollout_finished') AS f_artifact,
        toInt64(argMaxIf(j.oldest_policy_version, (us, eid), type = 'sandbox.rollout_finished')) AS f_oldest,
        toInt64(argMaxIf(j.newest_policy_version, (us, eid), type = 'sandbox.rollout_finished')) AS f_newest,
        argMaxIf(j.steps, (us, eid), type = 'sandbox.rollout_finished') AS f_steps,
        argMaxIf(j.tokens, (us, eid), type = 'sandbox.rollout_finished') AS f_tokens,

        countIf(type = 'sandbox.environment_failed') AS failures,
        countIf(type = 'sandbox.environment_failed' AND j.origin = 'environment') > 0 AS env_failed,
        countIf(type = 'sandbox.environment_failed' AND j.origin = 'model') > 0 AS model_error,
        argMinIf((j.failure_class, j.origin), (us, eid),
                 type = 'sandbox.environment_failed' AND j.origin = 'environment') AS env_failure,
        argMinIf((j.failure_class, j.origin), (us, eid), type = 'sandbox.environment_failed') AS any_failure,

        -- every verdict as (time, id, verdict, digest, verifier version, verifier id, reward); sorted, that
        -- is event order
        arraySort(groupArrayIf(
            (us, eid, j.verdict, j.artifact_digest, j.verifier_version, j.verifier_id, j.reward),
            type = 'verifier.verification_finished')) AS verdicts,

        countIf(type = 'sandbox.snapshot_taken') AS snapshots,
        sumIf(j.bytes, type = 'sandbox.snapshot_taken') AS snapshot_bytes,
        countIf(type = 'sandbox.resumed') AS resumes,
        countIf(type = 'sandbox.resumed' AND j.succeeded) AS resumes_succeeded,
        sumIf(j.steps_restored, type = 'sandbox.resumed') AS steps_restored,
        countIf(type = 'sandbox.interrupted') AS interruptions,
        arrayMap(x -> x.3, arraySort(groupArrayIf((us, eid, j.reason), type = 'sandbox.interrupted')))
            AS interruption_reasons
    FROM raw
    WHERE tid != '' AND tid >= {tid_from:String} AND ({tid_to:String} = '' OR tid < {tid_to:String})
    GROUP BY tid
),
traj AS (
    -- the trajectory records; columns the metrics use carry a t_ prefix
    SELECT
        tid AS trajectory_id,
        if(has_q, q_domain, first_domain) AS domain,
        intDiv(f_us, toInt64({window_s:UInt32}) * 1000000) * {window_s:UInt32} AS window_start,
        multiIf(has_f, 'finished', has_s, 'running', 'queued') AS t_status,
        has_f AS t_finished,
        if(has_f, intDiv(f_us, 1000), NULL) AS t_finished_ms,
        if(has_q, q_task, '') AS t_task_id,
        if(has_q, q_attempt, 1) AS t_attempt,
        if(has_q, q_environment, '') AS t_environment_version,

        env_failed AS t_env_failed,
        model_error AS t_model_error,
        failures AS t_failures,
        if(env_failed, env_failure, any_failure) AS main_failure,
        main_failure.1 AS t_failure_class,
        main_failure.2 AS t_failure_origin,

        notEmpty(verdicts) AS has_v,
        arrayFilter(x -> x.1 <= f_us + {timeout_us:Int64}, verdicts) AS timely,
        if(has_f AND notEmpty(timely), timely[-1], verdicts[-1]) AS chosen,
        if(has_v, chosen.3, '') AS t_verdict,
        if(has_v, chosen.5, '') AS t_verifier_version,
        if(has_f, f_artifact, '') AS t_artifact_digest,
        has_v AND has_f AND chosen.4 = f_artifact AND f_artifact != '' AS t_digest_match,
        has_v AND has_f AND (chosen.1 - f_us) / 1e6 <= {timeout_s:Float64} AS t_in_time,
        has_f AND NOT env_failed AND t_verdict IN ('passed', 'failed') AND t_digest_match AND t_in_time AS t_decided,
        t_decided AND t_verdict = 'passed' AS t_passed,
        if(has_f AND NOT env_failed AND NOT t_decided,
           multiIf(NOT has_v, 'no_verdict', t_verdict = 'undecidable', 'verdict_undecidable',
                   t_verdict = 'error', 'verifier_error', NOT t_in_time, 'verdict_late',
                   NOT t_digest_match, 'digest_mismatch', 'unknown'),
           '') AS t_undecidable_reason,
        has_f AND f_termination = 'completed' AS t_claimed_complete,

        if(has_f, toNullable(f_oldest), if(has_s, toNullable(s_policy), NULL)) AS t_oldest_policy_version,
        if(has_s, toNullable(s_policy), t_oldest_policy_version) AS t_policy_version,
        ifNull(t_oldest_policy_version, -1) AS oldest_or_none,
        arrayFilter((v, t) -> t <= f_us, tl_versions, tl_times) AS published_by_finish,
        if(notEmpty(published_by_finish), arrayMax(published_by_finish), f_newest) AS reference_version,
        arrayFilter((t, v) -> v > oldest_or_none, tl_times, tl_versions) AS newer_times,
        if(notEmpty(newer_times), toNullable(arrayMin(newer_times)), NULL) AS t_newer_us,
        has_f AND t_oldest_policy_version IS NOT NULL AS has_lag,
        if(has_lag, toNullable(greatest(toInt64(0), reference_version - oldest_or_none)), NULL) AS t_lag_versions,
        if(has_lag, toNullable(if(t_newer_us IS NULL, 0., greatest(0., (f_us - assumeNotNull(t_newer_us)) / 1e6))),
           NULL) AS t_lag_seconds,

        if(has_s AND has_q, toNullable((s_us - q_us) / 1e6), NULL) AS t_wait_s,
        if(has_f AND has_s, toNullable((f_us - s_us) / 1e6), NULL) AS t_run_s,

        snapshots AS t_snapshots,
        snapshot_bytes AS t_snapshot_bytes,
        resumes AS t_resumes,
        resumes_succeeded AS t_resumes_succeeded,
        steps_restored AS t_steps_restored,
        interruptions AS t_interruptions,
        interruption_reasons AS t_interruption_reasons,
        revision AS t_revision,

        -- the rest of the record (what the stream's trajectories table holds besides the metrics' fields)
        if(has_f, toNullable(f_newest), if(has_s, toNullable(s_policy), NULL)) AS t_newest_policy_version,
        if(has_f, toNullable(f_us), NULL) AS t_finished_us,
        if(has_q, toNullable(q_us), NULL) AS t_queued_us,
        if(has_s, toNullable(s_us), NULL) AS t_started_us,
        if(has_s, s_sandbox, '') AS t_sandbox_id,
        if(has_f, f_termination, '') AS t_termination,
        if(has_f, f_steps, 0) AS t_steps,
        if(has_f, f_tokens, 0) AS t_tokens,
        if(has_v, chosen.6, '') AS t_verifier_id,
        if(has_v, chosen.4, '') AS t_verified_digest,
        if(has_v, toNullable(chosen.1), NULL) AS t_verdict_us,
        if(has_v, chosen.7, NULL) AS t_reward
    FROM folded
),
consumed AS (
    -- one row per (trajectory, batch) of the run's batch_consumed events
    SELECT
        arrayJoin(JSONExtract(payload, 'trajectory_ids', 'Array(String)')) AS trajectory_id,
        JSONExtractString(payload, 'batch_id') AS batch_id,
        toInt64(JSONExtractUInt(payload, 'trainer_version')) AS trainer_version,
        us AS consumed_us
    FROM raw
    WHERE type = 'trainer.batch_consumed'
    ORDER BY consumed_us, eid
    LIMIT 1 BY trajectory_id, batch_id
),
consumption AS (
    -- consumptions of finished trajectories, in the consumed trajectory's domain and the batch's window
    -- (records and consumptions meet in a GROUP BY rather than a JOIN)
    SELECT
        domain,
        intDiv(use.2, toInt64({window_s:UInt32}) * 1000000) * {window_s:UInt32} AS window_start,
        greatest(toInt64(0), use.1 - oldest) AS c_lag_versions,
        if(newer_us IS NULL, 0., greatest(0., (use.2 - assumeNotNull(newer_us)) / 1e6)) AS c_lag_seconds
    FROM
    (
        SELECT
            trajectory_id,
            countIf(is_record) > 0 AS has_record,
            anyIf(record_domain, is_record) AS domain,
            anyIf(record_finished, is_record) AS finished,
            assumeNotNull(anyIf(record_oldest, is_record)) AS oldest,
            countIf(is_record AND record_oldest IS NOT NULL) > 0 AS has_oldest,
            anyIf(record_newer_us, is_record) AS newer_us,
            groupArrayIf(consumption, NOT is_record) AS uses
        FROM
        (
            SELECT trajectory_id, true AS is_record, domain AS record_domain, t_finished AS record_finished,
                   t_oldest_policy_version AS record_oldest, t_newer_us AS record_newer_us,
                   (toInt64(0), toInt64(0)) AS consumption
            FROM traj
            UNION ALL
            SELECT trajectory_id, false, '', false, NULL, NULL, (trainer_version, consumed_us)
            FROM consumed
        )
        GROUP BY trajectory_id
        HAVING has_record AND finished AND has_oldest
    )
    ARRAY JOIN uses AS use
)
