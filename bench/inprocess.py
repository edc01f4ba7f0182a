"""In one process of its own (``python -m bench.inprocess``): the sink and derivation without Kafka, and the
dashboard queries over a month of metric data.

1. **Seed.** A few hours of the bench scenario at the density of 10,000,000 events per 30 days go
   through ``streams.records.classify``, ``ClickHouseSink.write`` and ``Deriver.derive`` in batches,
   on an embedded ClickHouse (chdb), exactly as the worker calls them (under its collector policy, which
   ``main`` applies) but without Kafka and Faust. Every ClickHouse call is counted and timed by the function
   that made it.
2. **Month.** The seed's derived rows (trajectories, m_window_metrics, alerts) are copied
   into a fresh database once per seed span, shifted in time by the span, with trajectory and alert
   ids made unique and policy versions shifted so that each copy has versions of its own: a 30-day
   run of the same shape as if the worker had derived ~10M events. ``events_raw`` and
   ``consumptions`` are not copied: no dashboard reads them.
3. **Queries.** Every panel target (over the dashboards' default range, the last 6 h, and over the
   whole month), the variable queries and the alert rule queries are expanded as Grafana would and
   run read-only (``readonly=1``, as the worker's /sql runs them) on this process's client: a
   warm-up round, then interleaved rounds in which each query is repeated until about
   ``--query-budget`` seconds of its own time (at least 3, at most ``--max-repeats`` times).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import re
import sys
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.cli import log
from bench.dashboards import alert_cases, expand, panel_cases, ranges, variable_cases
from bench.measure import percentile
from bench.workload import EVENTS_PER_TRAJECTORY, accept, encode_all, scenario_for
from infra.clickhouse.client import connect
from infra.clickhouse.migrate import migrate
from infra.clickhouse.reader import run_read
from producers.simulator import generate
from rollout.settings import Settings
from schemas import TopicNames
from streams.app import derive_config
from streams.collector import tune_collector
from streams.derive import Deriver
from streams.sink_clickhouse import ClickHouseSink
from streams.state import OwnerState

SEED_DB = "bench_seed"
MONTH_DB = "bench_month"
COPIED_TABLES = ("trajectories", "m_window_metrics", "alerts")
DRILL_DOWN_DOMAIN = "cad"


class CountingClient:
    """A ClickHouse client that counts and times every call by the name of the function that made it."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.calls: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])

    def query(self, *args: Any, **kwargs: Any) -> Any:
        return self._timed("query", self._client.query, args, kwargs)

    def insert(self, *args: Any, **kwargs: Any) -> Any:
        return self._timed("insert", self._client.insert, args, kwargs)

    def command(self, *args: Any, **kwargs: Any) -> Any:
        return self._timed("command", self._client.command, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def _timed(self, kind: str, call: Any, args: Any, kwargs: Any) -> Any:
        frame = sys._getframe(2)
        while frame.f_back is not None and frame.f_code.co_filename.endswith("inserts.py"):
            frame = frame.f_back  # the Inserter is plumbing: name the code that asked for the insert
        caller = frame.f_code.co_name
        began = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            entry = self.calls[(caller, kind)]
            entry[0] += 1
            entry[1] += time.perf_counter() - began


def run_seed(client: Any, *, events_per_hour: float, hours: float, batch_size: int, log: Any) -> dict[str, Any]:
    """Derive ``hours`` of the bench scenario in-process; timings by phase and ClickHouse calls by caller."""
    migrate(client, SEED_DB)
    scenario = scenario_for(int(events_per_hour * hours), run_id="month",
                            trajectories_per_hour=events_per_hour / EVENTS_PER_TRAJECTORY, faults=True)
    span_s = hours * 3600.0
    scenario = scenario.model_copy(update={"duration": span_s,
                                           "trajectories": max(50, round(events_per_hour * hours /
                                                                         EVENTS_PER_TRAJECTORY))})
    events = list(generate(scenario))
    topics = TopicNames(SEED_DB)
    encoded = encode_all(events, topics.prefix)
    counting = CountingClient(client)
    settings = Settings()
    config = derive_config(settings)
    # As in a worker that owns the embedded engine: sink and derivation share the owner's caches.
    state = OwnerState(client=counting, database=SEED_DB, window_s=config.window_s,
                       default_staleness_bound=config.default_staleness_bound)
    sink = ClickHouseSink(client=counting, database=SEED_DB, state=state)  # type: ignore[arg-type]
    deriver = Deriver(client=counting, database=SEED_DB, config=config, state=state)
    phases = {"classify": 0.0, "sink.write": 0.0, "derive": 0.0}
    batches = 0
    log(f"  seed: {len(events):,} events ({hours:g} h of the scenario) in batches of {batch_size:,}")
    began = time.perf_counter()
    for start in range(0, len(events), batch_size):
        t0 = time.perf_counter()
        accepted = accept(encoded, topics, start, min(start + batch_size, len(events)))
        t1 = time.perf_counter()
        sink.write(accepted, [])
        t2 = time.perf_counter()
        deriver.derive(accepted)
        t3 = time.perf_counter()
        phases["classify"] += t1 - t0
        phases["sink.write"] += t2 - t1
        phases["derive"] += t3 - t2
        batches += 1
    seconds = time.perf_counter() - began
    calls = [{"caller": caller, "kind": kind, "calls": int(n), "seconds": s}
             for (caller, kind), (n, s) in sorted(counting.calls.items(), key=lambda kv: -kv[1][1])]
    return {
        "events": len(events), "trajectories": scenario.trajectories, "hours": hours,
        "start": scenario.start.isoformat(),
        "versions": scenario.policy.versions, "domains": [d.name for d in scenario.domains],
        "batches": batches, "batch_size": batch_size, "seconds": seconds, "phases": phases, "calls": calls,
    }


def _columns(client: Any, database: str, table: str) -> list[str]:
    rows = client.query("SELECT name FROM system.columns WHERE database = {db:String} AND table = {t:String} "
                        "ORDER BY position", parameters={"db": database, "t": table}).result_rows
    return [str(r[0]) for r in rows]


_TIMES = {"window_start", "window_end", "queued_at", "started_at", "finished_at", "verdict_at"}
_VERSIONS = {"policy_version", "oldest_policy_version", "newest_policy_version"}
_VERSION_ARRAYS = {"baseline_versions", "quality.policy_version"}
_IDS = {"trajectory_id", "alert_id"}


def _expression(column: str, shift_s: int, versions: int) -> str:
    shift = f"toIntervalSecond(c * {shift_s})"
    if column in _TIMES:
        return f"{column} + {shift}"
    if column == "finish_window":
        return f"if(toUnixTimestamp(finish_window) = 0, finish_window, finish_window + {shift})"
    if column in _IDS:
        return f"concat({column}, '~', toString(c))"
    if column in _VERSIONS:
        return f"{column} + c * {versions}"
    if column in _VERSION_ARRAYS:
        return f"arrayMap(x -> toUInt32(x + c * {versions}), {column})"
    return column


def build_month(client: Any, seed: dict[str, Any], *, days: float, log: Any) -> dict[str, Any]:
    """Copy the seed's derived rows once per seed span to cover ``days``; rows per table."""
    migrate(client, MONTH_DB)
    shift_s = int(seed["hours"] * 3600)
    copies = math.ceil(days * 86400 / shift_s)
    seed_start = datetime.fromisoformat(seed["start"])
    seed_end = seed_start + timedelta(seconds=shift_s)
    began = time.perf_counter()
    for table in COPIED_TABLES:
        columns = _columns(client, SEED_DB, table)
        if "window_start" in columns:
            where = "window_start < {end:DateTime('UTC')}"
        elif table == "trajectories":
            where = "finish_window < {end:DateTime('UTC')}"
        else:
            where = "1"
        select = ", ".join(_expression(c, shift_s, int(seed["versions"])) for c in columns)
        client.command(
            f"INSERT INTO {MONTH_DB}.{table} ({', '.join(columns)}) SELECT {select} "
            f"FROM {SEED_DB}.{table} CROSS JOIN (SELECT number AS c FROM numbers({copies})) AS copies WHERE {where}",
            parameters={"end": seed_end},
        )
    load_s = time.perf_counter() - began
    dropped = client.query(f"SELECT count() FROM {SEED_DB}.v_windows WHERE window_start >= {{end:DateTime('UTC')}}",
                           parameters={"end": seed_end}).result_rows[0][0]
    settle_began = time.perf_counter()
    while time.perf_counter() - settle_began < 180:
        merging = client.query("SELECT count() FROM system.merges WHERE database = {db:String}",
                               parameters={"db": MONTH_DB}).result_rows[0][0]
        if not merging:
            break
        time.sleep(1)
    settle_s = time.perf_counter() - settle_began
    rows = dict(client.query(
        "SELECT table, sum(rows) FROM system.parts WHERE database = {db:String} AND active GROUP BY table",
        parameters={"db": MONTH_DB}).result_rows)
    windows = client.query(f"SELECT count() FROM (SELECT DISTINCT run_id, domain, window_start FROM "
                           f"{MONTH_DB}.m_window_metrics)").result_rows[0][0]
    end = seed_start + timedelta(seconds=shift_s * copies)
    log(f"  month: {copies} copies of {seed['hours']:g} h, {sum(int(v) for v in rows.values()):,} rows "
        f"in {load_s:.0f}s (+{settle_s:.0f}s for merges)")
    return {
        "copies": copies, "shift_s": shift_s, "start": seed_start.isoformat(), "end": end.isoformat(),
        "events_equivalent": int(seed["events"]) * copies, "rows": {str(k): int(v) for k, v in rows.items()},
        "windows": int(windows), "load_seconds": load_s, "settle_seconds": settle_s,
        "dropped_seed_windows": int(dropped),
    }


PROBES = (
    ("m_window_metrics: every stored row, no FINAL", "SELECT count(), sum(finished) FROM m_window_metrics"),
    ("v_windows: the newest row of every window", "SELECT count() FROM v_windows"),
    ("v_effective_throughput: the newest row of every window",
     "SELECT count(), sum(finished) FROM v_effective_throughput"),
    ("v_env_failures: the newest row of every window, one row per failure",
     "SELECT count(), sum(failures) FROM v_env_failures"),
    ("v_trajectories: newest record of every trajectory", "SELECT count() FROM v_trajectories"),
)
"""Plain reads that show what the views cost by themselves (timed like the dashboard queries)."""


def _measure(client: Any, items: list[dict[str, Any]], *, budget_s: float, max_repeats: int) -> None:
    """A warm-up round (checks every query answers), then interleaved rounds; each query is repeated
    until about ``budget_s`` of its own time, at least 3 and at most ``max_repeats`` times."""
    for item in items:
        began = time.perf_counter()
        try:
            item["rows"] = len(run_read(client, item["sql"], None).rows)
            item["error"] = None
        except Exception as exc:  # recorded; the query counts as failed
            item["rows"] = 0
            item["error"] = str(exc).splitlines()[0][:300]
        warm = time.perf_counter() - began
        item["repeats"] = 0 if item["error"] else min(max_repeats, max(3, math.ceil(budget_s / max(warm, 1e-3))))
        item["samples_ms"] = []
    for round_index in range(max((i["repeats"] for i in items), default=0)):
        # As timeit does: the measuring process's garbage collector runs between rounds, not inside a
        # timed call (this process holds the seed's data; a full collection of it is not query latency).
        gc.collect()
        gc.disable()
        try:
            for item in items:
                if round_index >= item["repeats"]:
                    continue
                began = time.perf_counter()
                run_read(client, item["sql"], None)
                item["samples_ms"].append((time.perf_counter() - began) * 1000)
        finally:
            gc.enable()


def _explain(client: Any, since: datetime) -> dict[str, Any]:
    """What ClickHouse plans for a 6-hour read of one view: FINAL or not, and the granules its primary key keeps."""
    sql = ("SELECT count() FROM v_effective_throughput WHERE run_id = 'month' "
           f"AND window_start >= toDateTime('{since:%Y-%m-%d %H:%M:%S}', 'UTC')")
    text = "\n".join(str(r[0]) for r in client.query(f"EXPLAIN indexes = 1 {sql}").result_rows)
    tables = re.findall(r"ReadFromMergeTree \(([^)]*)\)", text)
    granules = re.findall(r"Granules: (\d+)/(\d+)", text)
    return {"sql": sql, "tables": tables, "final": "FINAL: 1" in text,
            "granules": f"{granules[-1][0]}/{granules[-1][1]}" if granules else None}


def run_queries(client: Any, month: dict[str, Any], domains: list[str], *, budget_s: float, max_repeats: int,
                log: Any) -> dict[str, Any]:
    """Every dashboard, variable and alert query, and the probes; latencies in milliseconds."""
    client.database = MONTH_DB
    start = datetime.fromisoformat(month["start"]).astimezone(UTC)
    end = datetime.fromisoformat(month["end"]).astimezone(UTC)
    spans = ranges(start, end)
    items: list[dict[str, Any]] = []
    for case in [*variable_cases(), *panel_cases()]:
        for label, span in spans.items():
            items.append({"case": case, "range": label,
                          "sql": expand(case, time_range=span, run="month", domains=domains,
                                        drill_down=DRILL_DOWN_DOMAIN)})
    for case in alert_cases():
        items.append({"case": case, "range": f"rule's own (last {case.relative_from_s // 3600} h)",
                      "sql": expand(case, time_range=spans[next(iter(spans))], run="month", domains=domains,
                                    drill_down=DRILL_DOWN_DOMAIN)})
    probes: list[dict[str, Any]] = [{"title": title, "sql": sql} for title, sql in PROBES]
    explain = _explain(client, spans["last 6 h"].start)
    log(f"  {len(items)} queries and {len(probes)} probes: a warm-up round, then each repeated for about "
        f"{budget_s:g}s of its own time (3 to {max_repeats} times)")
    began = time.perf_counter()
    _measure(client, items + probes, budget_s=budget_s, max_repeats=max_repeats)
    seconds = time.perf_counter() - began
    results = []
    for item in items:
        case = item["case"]
        samples = item["samples_ms"]
        results.append({
            "kind": case.kind, "board": case.board, "title": case.title, "ref": case.ref, "range": item["range"],
            "rows": item["rows"], "error": item["error"], "samples_ms": samples,
            "p50_ms": percentile(samples, 50) if samples else None,
            "p95_ms": percentile(samples, 95) if samples else None,
        })
    probe_results = [{"title": p["title"], "sql": p["sql"], "error": p["error"], "samples_ms": p["samples_ms"],
                      "p50_ms": percentile(p["samples_ms"], 50) if p["samples_ms"] else None}
                     for p in probes]
    return {"queries": results, "probes": probe_results, "explain": explain, "seconds": seconds, "budget_s": budget_s,
            "max_repeats": max_repeats, "ranges": {k: [v.start.isoformat(), v.end.isoformat()]
                                                   for k, v in spans.items()}}


def main(argv: list[str] | None = None) -> int:
    """Command line: seed, month, queries; the result as JSON in ``--out``."""
    parser = argparse.ArgumentParser(prog="python -m bench.inprocess", description=__doc__)
    parser.add_argument("--data-dir", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--month-events", type=int, default=10_000_000)
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--seed-hours", type=float, default=2.0)
    parser.add_argument("--batch-size", type=int, default=2000)
    parser.add_argument("--query-budget", type=float, default=1.0, help="seconds of repeats per query")
    parser.add_argument("--max-repeats", type=int, default=20)
    args = parser.parse_args(argv)

    client = connect(f"chdb://{args.data_dir.resolve() / 'clickhouse'}", database=SEED_DB)
    # The worker's collector policy (``rollout worker`` applies it at start): without it the seed's phases
    # include full collections over the whole generated workload, which the worker never makes.
    freezer = tune_collector()
    try:
        events_per_hour = args.month_events / (args.days * 24)
        seed = run_seed(client, events_per_hour=events_per_hour, hours=args.seed_hours, batch_size=args.batch_size,
                        log=log)
        month = build_month(client, seed, days=args.days, log=log)
        queries = run_queries(client, month, seed["domains"], budget_s=args.query_budget,
                              max_repeats=args.max_repeats, log=log)
    finally:
        freezer.stop()
        client.close()
    args.out.write_text(json.dumps({"seed": seed, "month": month, **queries}, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
