-- v_effective_throughput: finished, environment-valid, decided, passed, undecidable, digest mismatches, model errors.
SELECT
    domain,
    window_start,
    count() AS finished,
    countIf(NOT t_env_failed) AS env_valid,
    countIf(NOT t_env_failed AND t_decided) AS decided,
    countIf(NOT t_env_failed AND t_decided AND t_passed) AS passed,
    env_valid - decided AS undecidable,
    countIf(NOT t_env_failed AND t_verdict != '' AND NOT t_digest_match) AS digest_mismatches,
    countIf(t_model_error) AS model_errors
FROM traj
WHERE t_finished
GROUP BY domain, window_start
