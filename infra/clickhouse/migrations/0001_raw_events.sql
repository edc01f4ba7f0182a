-- Raw events: one row per distinct event_id (the sink drops re-deliveries before inserting).
-- Ordered by (run_id, trajectory_id, occurred_at, event_id): the sink's duplicate check is a point
-- lookup on the primary key (a re-delivered event has the same run, trajectory, time and id), and
-- trajectory assembly reads a trajectory's events as one contiguous range.
CREATE TABLE IF NOT EXISTS {db}.events_raw
(
    event_id         UUID,
    event_type       LowCardinality(String),
    schema_version   UInt16,
    occurred_at      DateTime64(6, 'UTC'),
    run_id           LowCardinality(String),
    domain           LowCardinality(String),
    trajectory_id    String,
    producer_kind    LowCardinality(String),
    producer_id      String,
    producer_version LowCardinality(String),
    payload          String CODEC(ZSTD(3)),
    source_topic     LowCardinality(String),
    source_partition UInt32,
    source_offset    UInt64,
    ingested_at      DateTime64(3, 'UTC'),
    INDEX idx_time occurred_at TYPE minmax GRANULARITY 1,
    INDEX idx_type event_type TYPE set(32) GRANULARITY 1
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(occurred_at)
ORDER BY (run_id, trajectory_id, occurred_at, event_id);

-- Messages that were not valid events, with the reason and their source position.
CREATE TABLE IF NOT EXISTS {db}.dead_letters
(
    source_topic     LowCardinality(String),
    source_partition UInt32,
    source_offset    UInt64,
    reason           LowCardinality(String),
    detail           String,
    message_key      String,
    raw              String CODEC(ZSTD(3)),
    raw_bytes        UInt32,
    dead_lettered_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree
ORDER BY (source_topic, source_partition, source_offset);
