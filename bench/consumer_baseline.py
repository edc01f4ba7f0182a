"""The worker's baseline: a plain consumer loop that stores raw rows and nothing else.

confluent-kafka consumer → ``orjson.loads`` → one ``events_raw`` row per message → batch insert into
the embedded ClickHouse (chdb, the same table and the same client library as the worker) → commit.
No validation, no dead letters, no duplicate check, no derivation. Runs as its own process
(``python -m bench.consumer_baseline``) so that, like the worker, it owns its ClickHouse folder.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Consumer

from infra.clickhouse.client import connect
from infra.clickhouse.migrate import migrate
from streams.records import RAW_COLUMNS


def raw_row(value: bytes, topic: str, partition: int, offset: int, now: datetime) -> list[Any]:
    """The ``events_raw`` row of one message, straight from its JSON (no schema validation)."""
    data = orjson.loads(value)
    producer = data.get("producer") or {}
    return [
        data["event_id"],
        data["event_type"],
        int(data.get("schema_version", 1)),
        datetime.fromisoformat(data["occurred_at"]),
        data["run_id"],
        data.get("domain") or "",
        data.get("trajectory_id") or "",
        producer.get("kind", ""),
        producer.get("id", ""),
        producer.get("version", ""),
        value.decode(),
        topic,
        partition,
        offset,
        now,
    ]


def run(*, bootstrap: str, topics: list[str], group: str, data_dir: Path, database: str, batch_size: int,
        expect: int, timeout: float) -> dict[str, Any]:
    """Consume ``expect`` messages in batches of ``batch_size``; return (time, stored) samples per batch and the
    process's CPU seconds at each."""
    client = connect(f"chdb://{data_dir.resolve() / 'clickhouse'}", database=database)
    migrate(client, database)
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })
    consumer.subscribe(topics)
    began = time.monotonic()
    samples: list[tuple[float, int]] = [(0.0, 0)]
    cpu = [time.process_time()]  # this process's CPU seconds (every thread, the engine's too) at each sample
    stored = 0
    try:
        while stored < expect:
            if time.monotonic() - began > timeout:
                raise TimeoutError(f"stored {stored} of {expect} in {timeout:.0f}s")
            messages = consumer.consume(num_messages=batch_size, timeout=0.5)
            now = datetime.now(UTC)
            rows = [raw_row(m.value() or b"", m.topic() or "", m.partition() or 0, m.offset() or 0, now)
                    for m in messages if m.error() is None and m.value() is not None]
            if rows:
                client.insert("events_raw", rows, column_names=RAW_COLUMNS, database=database)
                consumer.commit(asynchronous=True)
                stored += len(rows)
                samples.append((time.monotonic() - began, stored))
                cpu.append(time.process_time())
        count = client.query(f"SELECT count() FROM `{database}`.events_raw").result_rows[0][0]
    finally:
        consumer.close()
        client.close()
    return {"samples": samples, "cpu": cpu, "stored": stored, "rows": int(count)}


def reader_parser(module: str, description: str | None) -> argparse.ArgumentParser:
    """The command line every reference reader of the bench shares: where, as which group, how much, how long."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=description)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topics", required=True, help="comma-separated raw topics")
    parser.add_argument("--group", required=True)
    parser.add_argument("--data-dir", required=True, type=Path)
    parser.add_argument("--batch-size", type=int, default=2000)
    parser.add_argument("--expect", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=600.0)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Command line: consume, store, print the result as JSON on stdout."""
    parser = reader_parser("bench.consumer_baseline", __doc__)
    parser.add_argument("--database", default="rollout")
    args = parser.parse_args(argv)
    result = run(bootstrap=args.bootstrap, topics=args.topics.split(","), group=args.group, data_dir=args.data_dir,
                 database=args.database, batch_size=args.batch_size, expect=args.expect, timeout=args.timeout)
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
