-- v_verifier_integrity: per verifier version, verdicts by outcome, digest mismatches, completed-but-failed claims.
SELECT
    domain,
    window_start,
    t_verifier_version AS verifier_version,
    count() AS verdicts,
    countIf(t_verdict = 'passed') AS passed,
    countIf(t_verdict = 'failed') AS failed,
    countIf(t_verdict = 'undecidable') AS undecidable,
    countIf(t_verdict = 'error') AS errors,
    countIf(NOT t_digest_match) AS digest_mismatches,
    countIf(t_claimed_complete AND t_verdict = 'failed') AS claimed_complete_failed
FROM traj
WHERE t_finished AND t_verdict != ''
GROUP BY domain, window_start, verifier_version
