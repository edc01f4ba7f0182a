-- v_domain_quality: decided and passed per policy version (the version the rollout started on).
SELECT
    domain,
    window_start,
    assumeNotNull(t_policy_version) AS policy_version,
    count() AS decided,
    countIf(t_passed) AS passed
FROM traj
WHERE t_finished AND t_decided AND t_policy_version IS NOT NULL
GROUP BY domain, window_start, policy_version
