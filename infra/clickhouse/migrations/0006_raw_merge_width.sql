-- events_raw merges at most 5 parts at once (default 100; in practice the worker's merges took 8-9).
--
-- A merge holds a block of every source part in memory at once, and events_raw's blocks are mostly
-- payload text (~1 KB per event): in 10,000,000-event replays the worker's memory rose by 100-150 MiB
-- for a few seconds about once a minute while events_raw merged 8-9 parts of ~430 MiB, and that set
-- the run's peak. Merging at most 5 parts took a 9-part merge's engine-tracked peak from 94 to 62 MiB
-- in-process, and a 10,000,000-event replay's peak RSS from 1,051 to 972 MiB (docs/performance.md,
-- Memory). Settings only: existing parts are not rewritten.
--
-- On a ClickHouse server the worker's role needs ALTER SETTINGS for this: run
-- `rollout infra clickhouse-users` again first.

ALTER TABLE {db}.events_raw MODIFY SETTING max_parts_to_merge_at_once = 5;
