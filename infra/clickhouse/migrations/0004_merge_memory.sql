-- Less memory per merge on the tables the worker writes most (measured: docs/performance.md, Memory).
--
-- A horizontal merge opens a reader of every column of every source part and a writer with its
-- compression buffers (up to max_compress_block_size, 1 MiB by default, per column stream) for every
-- column of the new part, all at once. trajectories has ~50 columns, many Nullable or LowCardinality
-- (two streams each), so merging 7 parts of 10,000 random rows tracked ~400 MiB on the embedded engine, and
-- in a 10,000,000-event replay the engine's tracked memory rose from ~24 MiB to ~490 MiB while
-- trajectories and trajectories_latest merged. ClickHouse merges vertically (key columns first, then
-- one column at a time) only from 131,072 rows and 11 columns: here every merge is vertical, and
-- compression blocks are at most 64 KiB. The same 7-part merge tracked ~90 MiB; a 1,000,000-event
-- replay's engine peak went from 214 to 91 MiB. Settings only: existing parts are not rewritten.
--
-- On a ClickHouse server the worker's role needs ALTER SETTINGS for this: run
-- `rollout infra clickhouse-users` again first.

ALTER TABLE {db}.events_raw MODIFY SETTING vertical_merge_algorithm_min_rows_to_activate = 1,
    vertical_merge_algorithm_min_columns_to_activate = 1, max_compress_block_size = 65536,
    min_compress_block_size = 16384;

ALTER TABLE {db}.trajectories MODIFY SETTING vertical_merge_algorithm_min_rows_to_activate = 1,
    vertical_merge_algorithm_min_columns_to_activate = 1, max_compress_block_size = 65536,
    min_compress_block_size = 16384;

ALTER TABLE {db}.trajectories_latest MODIFY SETTING vertical_merge_algorithm_min_rows_to_activate = 1,
    vertical_merge_algorithm_min_columns_to_activate = 1, max_compress_block_size = 65536,
    min_compress_block_size = 16384;

ALTER TABLE {db}.m_window_metrics MODIFY SETTING vertical_merge_algorithm_min_rows_to_activate = 1,
    vertical_merge_algorithm_min_columns_to_activate = 1, max_compress_block_size = 65536,
    min_compress_block_size = 16384;
