-- Decided and passed trajectories per domain and policy version over the whole run (input of the regression check).
SELECT
    domain,
    assumeNotNull(t_policy_version) AS policy_version,
    count() AS decided,
    countIf(t_passed) AS passed
FROM traj
WHERE t_finished AND t_decided AND t_policy_version IS NOT NULL
GROUP BY domain, policy_version
