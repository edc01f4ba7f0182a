"""One bulk replay (``streams.replay``, what ``rollout replay`` runs) in a process of its own, for the suite.

It reads the raw topics of ``--topic-prefix`` into a fresh embedded ClickHouse in ``--data-dir`` and
prints, as JSON: what the replay stored and wrote, its seconds (from the first read to the last table
written: the process's start-up and the migrations are not in them, ``wall_seconds`` has everything),
and every ``v_*`` view's rows, read as the worker's ``/sql`` returns them, so ``bench.pipeline``
compares them with the live worker's exactly as it compares a replaying worker's.

    python -m bench.bulk_replay --bootstrap HOST:PORT --topic-prefix P --data-dir DIR [--batch-size N] [--no-views]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from bench.cli import at_least, log
from infra.clickhouse.client import connect
from infra.clickhouse.migrate import migrate
from infra.clickhouse.reader import QueryResult, run_read
from rollout.settings import Settings
from streams.app import derive_config
from streams.collector import tune_collector
from streams.replay import READ_BATCH, replay


def peak_rss() -> int:
    """This process's peak RSS in bytes (the embedded engine's memory included), from ``VmHWM``.

    Not ``getrusage``'s ``ru_maxrss``: Linux keeps that across ``exec``, so a child started by a large
    parent reports the parent's peak (8 GB against 2.2 GB sampled)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def main(argv: list[str] | None = None) -> int:
    began = time.perf_counter()
    parser = argparse.ArgumentParser(prog="python -m bench.bulk_replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers")
    parser.add_argument("--topic-prefix", required=True, help="prefix of the raw topics to read")
    parser.add_argument("--data-dir", required=True, type=Path, help="a folder of its own (the embedded ClickHouse)")
    parser.add_argument("--batch-size", type=at_least(1), default=READ_BATCH, help="messages per insert")
    parser.add_argument("--no-views", action="store_true", help="do not read the views back")
    args = parser.parse_args(argv)
    settings = Settings(data_dir=args.data_dir, kafka_bootstrap_servers_setting=args.bootstrap,
                        topic_prefix=args.topic_prefix, consumer_group=f"bench-bulk-{args.data_dir.name}")
    freezer = tune_collector()
    client = connect(settings.clickhouse_url, database=settings.clickhouse_database)
    try:
        migrate(client, settings.clickhouse_database)
        result = replay(settings, client, settings.clickhouse_database, derive_config(settings),
                        batch=args.batch_size, progress=lambda text: log(f"    {text}"))
        wall = time.perf_counter() - began

        def read(sql: str) -> QueryResult:
            # As the worker's /sql answers: values through JSON (datetimes and UUIDs as text).
            found = run_read(client, sql, None)
            return QueryResult(found.columns, found.types, orjson.loads(orjson.dumps(found.rows, default=str)))

        listing = ("SELECT name FROM system.tables WHERE database = currentDatabase() AND name LIKE 'v\\_%' "
                   "ORDER BY name")
        names = [] if args.no_views else [str(r[0]) for r in read(listing).rows]
        views: dict[str, Any] = {}
        for name in names:
            found = read(f"SELECT * FROM {name}")
            views[name] = {"columns": found.columns, "rows": found.rows}
    finally:
        freezer.stop()
        client.close()
    loaded = result.load
    out = {
        "messages": loaded.messages, "stored": loaded.stored, "duplicates": loaded.duplicates,
        "dead_lettered": loaded.dead_lettered, "load_seconds": loaded.seconds, "seconds": result.seconds,
        "wall_seconds": wall,
        "peak_rss": peak_rss(),
        "runs": [{"run_id": r.run_id, "engine": r.engine, "parts": r.parts, "trajectories": r.trajectories,
                  "consumptions": r.consumptions,
                  "windows": r.windows, "alerts": r.alerts, "seconds": r.seconds} for r in result.runs],
        "views": views,
    }
    sys.stdout.buffer.write(orjson.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
