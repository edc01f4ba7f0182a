-- v_budget: sandbox-seconds (run time of finished trajectories), effective trajectories, configured weight.
SELECT
    domain,
    window_start,
    sum(ifNull(t_run_s, 0.)) AS sandbox_seconds,
    countIf(t_decided) AS effective,
    if(run_weights_total > 0, run_weights[domain] / run_weights_total, 0.) AS configured_weight
FROM traj
WHERE t_finished
GROUP BY domain, window_start
