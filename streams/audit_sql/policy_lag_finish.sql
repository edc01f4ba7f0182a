-- v_policy_lag, stage finish: lag at finish in versions and seconds (p50, p95, max), count over the bound.
SELECT
    domain,
    window_start,
    'finish' AS stage,
    count() AS trajectories,
    quantileExact(0.5)(toFloat64(assumeNotNull(t_lag_versions))) AS lag_versions_p50,
    quantileExact(0.95)(toFloat64(assumeNotNull(t_lag_versions))) AS lag_versions_p95,
    toFloat64(max(assumeNotNull(t_lag_versions))) AS lag_versions_max,
    quantileExact(0.5)(assumeNotNull(t_lag_seconds)) AS lag_seconds_p50,
    quantileExact(0.95)(assumeNotNull(t_lag_seconds)) AS lag_seconds_p95,
    max(assumeNotNull(t_lag_seconds)) AS lag_seconds_max,
    countIf(assumeNotNull(t_lag_versions) > run_staleness_bound) AS over_bound,
    run_staleness_bound AS staleness_bound
FROM traj
WHERE t_finished AND t_lag_versions IS NOT NULL AND t_lag_seconds IS NOT NULL
GROUP BY domain, window_start
