-- v_interruptions: interruptions by reason among the window's finished trajectories.
SELECT domain, window_start, reason, count() AS interruptions
FROM traj
ARRAY JOIN t_interruption_reasons AS reason
WHERE t_finished
GROUP BY domain, window_start, reason
