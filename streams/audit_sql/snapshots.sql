-- v_snapshots: snapshots and resumes of the window's finished trajectories, and how resumed ones ended.
SELECT
    domain,
    window_start,
    sum(t_snapshots) AS snapshots,
    sum(t_snapshot_bytes) AS snapshot_bytes,
    sum(t_resumes) AS resumes,
    sum(t_resumes_succeeded) AS resumes_succeeded,
    sum(t_steps_restored) AS steps_restored,
    countIf(t_resumes > 0) AS resumed_trajectories,
    countIf(t_resumes > 0 AND t_passed) AS resumed_passed
FROM traj
WHERE t_finished
GROUP BY domain, window_start
