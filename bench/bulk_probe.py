"""What a bulk replay would cost: raw rows first, then every metric family from them in SQL.

The replay target (50,000 events/s over a 1,000,000-event log) is out of reach of the live path run
faster (docs/performance.md, *Left*). This probe measures, in-process on the embedded engine, the
three phases of the bulk path:

1. load: validate each message (``streams.records.classify``, as the worker does) and insert the
   accepted payloads into ``events_raw_in`` in large batches (the engine derives the raw rows), once
   with the inserts on the validating thread and once beside it, side by side;
2. assembly: the audit's trajectory assembly (``streams/audit_sql/assembly.sql``), run once into
   in-memory tables (the run's configuration, its trajectories, and consumptions from those
   trajectories) instead of once per family;
3. families: each audit family's query on those tables.

It writes no metric table: ``rollout replay`` (``streams.replay``) is the bulk path itself, with Kafka,
deduplication and every derived table; this probe times its phases in-process, without Kafka. Usage::

    python -m bench.bulk_probe [--events 1000000] [--batch-size 50000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from bench.cli import at_least, log
from bench.config import SPEC_DENSITY_PER_HOUR
from bench.workload import EVENTS_PER_TRAJECTORY, accept, encode_all, events_for
from infra.clickhouse.client import connect
from infra.clickhouse.inserts import Inserter
from infra.clickhouse.migrate import migrate
from infra.clickhouse.reader import run_read
from rollout.settings import Settings
from schemas import TopicNames
from streams.app import derive_config
from streams.audit import SQL_DIR, audit_params, audit_sql
from streams.collector import tune_collector
from streams.records import RAW_INPUT_COLUMNS, ingestion_ms, raw_input_row
from streams.replay import ReplayResult, materialise, rebuild
from streams.replay import load as load_log
from streams.replay import on_assembled as replay_sql_on

DATABASE = "bulk_probe"
PREFIX = "a_"
RUN_ID = "bulk"
BESIDE = {False: "on the validating thread", True: "beside validation"}
SKIPPED = ("assembly.sql", "weights.sql")
"""Not a family: the expressions every query starts with, and the configured weights."""


def probe_params(settings: Settings) -> dict[str, Any]:
    """The audit SQL's parameters for ``RUN_ID`` with ``settings``' windows, verdict timeout and staleness bound."""
    return audit_params(RUN_ID, window_s=settings.metrics_window_seconds,
                        verdict_timeout_s=settings.verdict_timeout_seconds,
                        default_staleness_bound=settings.default_staleness_bound)


def on_assembled(sql: str) -> str:
    """A query reading the materialised assembly (``a_<name>``) instead of recomputing it."""
    return replay_sql_on(sql, PREFIX)


def bench_log(events: int) -> Any:
    """``events`` messages of the bench scenario at the suite's density, encoded as the producers send them."""
    density = SPEC_DENSITY_PER_HOUR / EVENTS_PER_TRAJECTORY
    return encode_all(events_for(events, run_id=RUN_ID, trajectories_per_hour=density), TopicNames(DATABASE).prefix)


def load(client: Any, database: str, encoded: Any, batch_size: int, *, beside: bool) -> dict[str, float]:
    """Phase 1: validate ``encoded`` (``bench_log``) and insert what is accepted into ``database``'s raw table.

    With ``beside`` a batch's insert runs on a thread of its own while the next batch is validated (the
    engine's part of an insert runs without the interpreter lock), as the worker's sink does. Returns the
    messages read and accepted (the rest are the scenario's malformed ones), the seconds in total, in
    validation and in the inserts (with ``beside``: waiting for the insert before)."""
    topics = TopicNames(DATABASE)
    count = len(encoded.values)
    inserter = Inserter(client, database)
    now = datetime.now(UTC)
    validate = insert = 0.0
    stored = 0
    pending: Future[None] | None = None
    began = time.perf_counter()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="probe-insert") as executor:
        for start in range(0, count, batch_size):
            t0 = time.perf_counter()
            accepted = accept(encoded, topics, start, min(start + batch_size, count))
            ingested = ingestion_ms(now)
            rows = [raw_input_row(item, ingested) for item in accepted]
            t1 = time.perf_counter()
            if pending is not None:
                pending.result()
            if beside:
                pending = executor.submit(inserter.insert, "events_raw_in", rows, RAW_INPUT_COLUMNS)
            else:
                inserter.insert("events_raw_in", rows, RAW_INPUT_COLUMNS)
            stored += len(accepted)
            validate += t1 - t0
            insert += time.perf_counter() - t1
        t1 = time.perf_counter()
        if pending is not None:
            pending.result()
        insert += time.perf_counter() - t1
    return {"messages": count, "accepted": stored, "seconds": time.perf_counter() - began, "validate": validate,
            "insert": insert}


def assemble(client: Any, params: dict[str, Any]) -> dict[str, tuple[float, int]]:
    """Phase 2: each assembled expression into an in-memory table of the client's database; seconds and rows."""
    out: dict[str, tuple[float, int]] = {}

    def timed(name: str, seconds: float) -> None:
        out[name] = (seconds, int(client.query(f"SELECT count() FROM {PREFIX}{name}").result_rows[0][0]))

    materialise(client, client.database, params, PREFIX, timed)
    return out


def families(client: Any, params: dict[str, Any]) -> dict[str, tuple[float, int]]:
    """Phase 3: each family's query on the assembled tables; seconds and rows of each."""
    out: dict[str, tuple[float, int]] = {}
    for path in sorted(SQL_DIR.glob("*.sql")):
        if path.name in SKIPPED:
            continue
        began = time.perf_counter()
        # The assembly's expressions stay in front for its scalars (configured weights, staleness bound).
        result = run_read(client, on_assembled(audit_sql(path.name)), params)
        out[path.stem] = (time.perf_counter() - began, len(result.rows))
    return out


def replay_in_process(client: Any, encoded: Any, batch_size: int) -> ReplayResult:
    """``streams.replay``'s load and rebuild of ``encoded`` into a fresh database: the bulk replay without Kafka."""
    database = f"{DATABASE}_replay"
    migrate(client, database)
    began = time.perf_counter()
    count = len(encoded.values)
    batches = ([(encoded.values[i], encoded.keys[i], encoded.topics[i], 0, i)
                for i in range(start, min(start + batch_size, count))] for start in range(0, count, batch_size))
    loaded = load_log(client, database, batches, TopicNames(DATABASE))
    runs = rebuild(client, database, sorted(loaded.runs), derive_config(Settings()))
    return ReplayResult(loaded, runs, time.perf_counter() - began)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bulk_probe", description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=at_least(1000), default=1_000_000,
                        help="bench events to load (default 1,000,000)")
    parser.add_argument("--batch-size", type=at_least(1), default=50_000, help="events per raw insert (default 50,000)")
    args = parser.parse_args(argv)
    tune_collector()
    log(f"  generating {args.events:,} messages")
    encoded = bench_log(args.events)
    n = len(encoded.values)
    with tempfile.TemporaryDirectory(prefix="bulk-probe-") as folder:
        client = connect(f"chdb://{folder}")
        loads = {}
        for beside, database in ((False, f"{DATABASE}_serial"), (True, DATABASE)):
            log(f"  load: {n:,} messages in batches of {args.batch_size:,}, inserts {BESIDE[beside]}")
            migrate(client, database)
            loads[beside] = load(client, database, encoded, args.batch_size, beside=beside)
        client.database = DATABASE
        params = probe_params(Settings())
        log("  assembly")
        assembled = assemble(client, params)
        log("  families")
        derived = families(client, params)
        log("  streams.replay: load and rebuild")
        replayed = replay_in_process(client, encoded, args.batch_size)
    print(f"bulk path over {n:,} messages (embedded engine, in-process; no metric table written)")
    for beside, loaded in loads.items():
        print(f"load       {loaded['seconds']:7.2f} s  {n / loaded['seconds']:9,.0f} events/s  "
              f"(inserts {BESIDE[beside]}: validation {loaded['validate'] / n * 1e6:.1f} us/event, "
              f"inserts {loaded['insert'] / n * 1e6:.1f} us/event{' waited for' if beside else ''})")
    for name, (seconds, rows) in assembled.items():
        print(f"assemble   {seconds:7.2f} s  {rows:9,} rows of {name}")
    for name, (seconds, rows) in derived.items():
        print(f"  {name:24s} {seconds:7.3f} s  {rows:9,} rows")
    rest = sum(s for s, _ in assembled.values()) + sum(s for s, _ in derived.values())
    for beside, loaded in loads.items():
        total = loaded["seconds"] + rest
        print(f"all phases {total:7.2f} s  {n / total:9,.0f} events/s (inserts {BESIDE[beside]})")
    load_s = replayed.load.seconds
    steps = {step: sum(r.seconds[step] for r in replayed.runs) for step in replayed.runs[0].seconds}
    print(f"replay     {replayed.seconds:7.2f} s  {n / replayed.seconds:9,.0f} events/s (streams.replay without Kafka: "
          f"raw events {load_s:.2f} s, " + ", ".join(f"{k} {v:.2f} s" for k, v in steps.items()) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
