-- v_environment_versions: finished trajectories per environment version, and those with an environment failure.
SELECT
    domain,
    window_start,
    t_environment_version AS environment_version,
    count() AS finished,
    countIf(t_env_failed) AS env_failed
FROM traj
WHERE t_finished
GROUP BY domain, window_start, environment_version
