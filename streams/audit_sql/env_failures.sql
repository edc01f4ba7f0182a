-- v_env_failures: finished trajectories per (origin, failure class, environment version), with the window's total.
SELECT
    domain,
    window_start,
    t_failure_origin AS origin,
    t_failure_class AS failure_class,
    t_environment_version AS environment_version,
    count() AS failures,
    any(window_finished) AS finished
FROM
(
    SELECT *, count() OVER (PARTITION BY domain, window_start) AS window_finished
    FROM traj
    WHERE t_finished
)
WHERE t_failure_class != ''
GROUP BY domain, window_start, origin, failure_class, environment_version
