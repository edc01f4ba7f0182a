-- Every window that has a finished trajectory or a consumption.
SELECT DISTINCT domain, window_start
FROM
(
    SELECT domain, window_start FROM traj WHERE t_finished
    UNION ALL
    SELECT domain, window_start FROM consumption
)
