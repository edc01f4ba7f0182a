-- The run's configured domain weights, normalised to sum to 1 (all 0 when they sum to 0).
SELECT
    domain_weight.1 AS domain,
    if(run_weights_total > 0, domain_weight.2 / run_weights_total, 0.) AS configured_weight
FROM (SELECT arrayJoin(arrayZip(mapKeys(run_weights), mapValues(run_weights))) AS domain_weight)
