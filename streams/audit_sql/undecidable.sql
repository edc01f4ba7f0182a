-- v_undecidable: finished, env-valid, undecided trajectories per undecidable reason.
SELECT domain, window_start, t_undecidable_reason AS undecidable_reason, count() AS trajectories
FROM traj
WHERE t_finished AND t_undecidable_reason != ''
GROUP BY domain, window_start, undecidable_reason
