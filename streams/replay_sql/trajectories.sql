-- Every trajectory record of a run into `trajectories`, one row each at {version:UInt64}, from the
-- assembly materialised by streams.replay (the audit's `traj`): the columns streams.derive writes.
-- An unfinished trajectory's finish_window is 1970-01-01, as the worker writes it.
INSERT INTO trajectories
    (run_id, domain, finish_window, trajectory_id, task_id, attempt, environment_version, status, sandbox_id,
     policy_version, oldest_policy_version, newest_policy_version, queued_at, started_at, finished_at, wait_s,
     run_s, termination, steps, tokens, artifact_digest, env_failed, failure_class, failure_origin, failures,
     model_error, verdict, verifier_id, verifier_version, verified_digest, verdict_at, reward, digest_match,
     decided, passed, undecidable_reason, claimed_complete, lag_versions, lag_seconds, snapshots,
     snapshot_bytes, resumes, resumes_succeeded, steps_restored, interruptions, interruption_reasons, revision,
     version)
SELECT
    {run:String}, domain, toDateTime(if(t_finished, window_start, 0), 'UTC'), trajectory_id, t_task_id,
    t_attempt, t_environment_version, t_status, t_sandbox_id,
    t_policy_version, t_oldest_policy_version, t_newest_policy_version,
    fromUnixTimestamp64Micro(t_queued_us, 'UTC'), fromUnixTimestamp64Micro(t_started_us, 'UTC'),
    fromUnixTimestamp64Micro(t_finished_us, 'UTC'), t_wait_s,
    t_run_s, t_termination, t_steps, t_tokens, t_artifact_digest, t_env_failed, t_failure_class,
    t_failure_origin, t_failures,
    t_model_error, t_verdict, t_verifier_id, t_verifier_version, t_verified_digest,
    fromUnixTimestamp64Micro(t_verdict_us, 'UTC'), t_reward, t_digest_match,
    t_decided, t_passed, t_undecidable_reason, t_claimed_complete, t_lag_versions, t_lag_seconds, t_snapshots,
    t_snapshot_bytes, t_resumes, t_resumes_succeeded, t_steps_restored, t_interruptions, t_interruption_reasons,
    t_revision,
    {version:UInt64}
FROM traj
