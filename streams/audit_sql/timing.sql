-- v_timing: wait (started − queued) and run (finished − started) p50/p95 in seconds, interruptions.
SELECT
    domain,
    window_start,
    count() AS finished,
    quantileExact(0.5)(t_wait_s) AS wait_s_p50,
    quantileExact(0.95)(t_wait_s) AS wait_s_p95,
    quantileExact(0.5)(t_run_s) AS run_s_p50,
    quantileExact(0.95)(t_run_s) AS run_s_p95,
    sum(t_interruptions) AS interruptions
FROM traj
WHERE t_finished
GROUP BY domain, window_start
