-- v_policy_lag, stage consumption: lag at consumption (trainer version − oldest version used; consumption
-- time − publication of the first newer version), p50, p95, max, count over the bound.
SELECT
    domain,
    window_start,
    'consumption' AS stage,
    count() AS trajectories,
    quantileExact(0.5)(toFloat64(c_lag_versions)) AS lag_versions_p50,
    quantileExact(0.95)(toFloat64(c_lag_versions)) AS lag_versions_p95,
    toFloat64(max(c_lag_versions)) AS lag_versions_max,
    quantileExact(0.5)(c_lag_seconds) AS lag_seconds_p50,
    quantileExact(0.95)(c_lag_seconds) AS lag_seconds_p95,
    max(c_lag_seconds) AS lag_seconds_max,
    countIf(c_lag_versions > run_staleness_bound) AS over_bound,
    run_staleness_bound AS staleness_bound
FROM consumption
GROUP BY domain, window_start
