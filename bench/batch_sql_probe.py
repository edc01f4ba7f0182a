"""What the engine would cost to derive each batch's trajectory records, beside the worker's Python derivation.

The worker derives in Python, batch by batch (``streams.derive``); the bulk replay derives in the
engine, once per run (``streams.replay``). Would the engine, asked per batch for the batch's
trajectories only, be cheaper than Python and so lift the worker's rate? This probe answers with
the first step of such a derivation. In-process on the embedded engine, without Kafka, the bench's
events go through the worker's steps in its batches: ``streams.records.classify``,
``ClickHouseSink.write`` and ``Deriver.derive``, the last one timed (the whole Python derivation:
records, windows, consumptions, alerts and every write). After each batch, the audit's assembly
(``streams/audit_sql/assembly.sql``), limited to the batch's trajectories and the run's events
without one (policy versions, configuration), is asked for three of its steps, each as a query of
its own: the events parsed (``raw``), their fold per trajectory (``folded``) and the trajectory
records (``traj``). Each is timed by the wall clock and by the process's CPU (the engine's threads
included). Nothing more is derived in SQL and nothing is written: the windows, consumptions,
alerts and writes would come on top of ``traj``. The records ``traj`` computes are checked
against the ones the Python derivation stored.

The first batch (start-up of the engine's caches) is left out of the medians. Usage::

    python -m bench.batch_sql_probe [--events 150000] [--batch-size 10000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.cli import at_least, log
from bench.workload import accept, encode_all, events_for
from infra.clickhouse.client import connect
from infra.clickhouse.migrate import migrate
from rollout.settings import Settings
from schemas import TopicNames
from streams.app import derive_config
from streams.audit import audit_file, audit_params
from streams.collector import tune_collector
from streams.derive import Deriver
from streams.sink_clickhouse import ClickHouseSink
from streams.state import OwnerState

DATABASE = "batch_sql_probe"
RUN_ID = "bench"
STEPS = ("raw", "folded", "traj")
"""The assembly's steps asked for, in its order: each includes the ones before it."""

PART_FILTER = ("AND trajectory_id >= {tid_from:String} AND ({tid_to:String} = '' OR "
               "trajectory_id < {tid_to:String})")
"""The assembly's filter on a range of trajectory ids (``streams.replay.trajectory_parts``), for BATCH_FILTER."""

BATCH_FILTER = "AND (trajectory_id = '' OR trajectory_id IN (SELECT arrayJoin({tids:Array(String)})))"
"""The batch's trajectories, and the run's events without a trajectory (the sorting key serves both)."""

CHECKED = {"status": "status", "finished_us": "toUnixTimestamp64Micro(finished_at)", "decided": "decided",
           "passed": "passed", "lag_versions": "lag_versions"}
"""Fields of each record compared: ``traj``'s ``t_<name>`` against this expression over the stored Python record."""


def batch_assembly() -> str:
    """The audit's assembly with its trajectory filter limited to ``{tids:Array(String)}``."""
    sql = audit_file("assembly.sql")
    if PART_FILTER not in sql:
        raise RuntimeError("streams/audit_sql/assembly.sql no longer filters trajectories as PART_FILTER says; "
                           "update bench/batch_sql_probe.py")
    return sql.replace(PART_FILTER, BATCH_FILTER)


@dataclass
class Batch:
    """One batch: its trajectories, the Python derivation's time and each SQL step's (ms wall, ms CPU)."""

    trajectories: int
    derive: tuple[float, float]
    steps: dict[str, tuple[float, float]] = field(default_factory=dict)
    records: int = 0
    differing: int = 0


@dataclass
class ProbeResult:
    """Every batch of a probe run, in order."""

    events: int
    batch_size: int
    batches: list[Batch]

    def median(self, pick: Callable[[Batch], float]) -> float:
        """Median over the batches after the first (all of them when there is only one)."""
        measured = self.batches[1:] or self.batches
        return float(statistics.median(pick(b) for b in measured))


def _timed(call: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, tuple[float, float]]:
    """What ``call(*args, **kwargs)`` returned, and the milliseconds of wall clock and of the process's CPU (every
    thread's) it took."""
    wall, cpu = time.perf_counter(), time.process_time()
    value = call(*args, **kwargs)
    return value, ((time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000)


def _stored(client: Any, database: str, tids: list[str]) -> dict[str, tuple[Any, ...]]:
    rows = client.query(
        f"SELECT trajectory_id, {', '.join(CHECKED.values())} "
        f"FROM {database}.trajectories_latest FINAL WHERE run_id = {{run:String}} "
        "AND trajectory_id IN (SELECT arrayJoin({tids:Array(String)}))",
        parameters={"run": RUN_ID, "tids": tids}).result_rows
    return {str(r[0]): tuple(r[1:]) for r in rows}


def run(client: Any, database: str, events: int, batch_size: int, progress: Any = log) -> ProbeResult:
    """Validate, store and derive ``events`` bench events in batches of ``database`` (the client's current one); after
    each, time the SQL steps on its trajectories."""
    migrate(client, database)
    progress(f"  generating {events:,} events")
    generated = events_for(events, run_id=RUN_ID)
    generated.sort(key=lambda e: e.occurred_at)  # as the worker's event-time merge of the partitions reads them
    topics = TopicNames(database)
    encoded = encode_all(generated, topics.prefix)
    config = derive_config(Settings())
    state = OwnerState(client=client, database=database, window_s=config.window_s,
                       default_staleness_bound=config.default_staleness_bound)
    sink = ClickHouseSink(client=client, database=database, state=state)
    deriver = Deriver(client=client, database=database, config=config, state=state)
    assembly = batch_assembly()
    # Every column of a step is computed (hashed); the records' step also returns the fields the check compares.
    queries = {step: f"{assembly}\nSELECT count(), sum(cityHash64(*)) FROM {step}" for step in STEPS[:-1]}
    checked = ", ".join(f"t_{name}" for name in CHECKED)
    queries[STEPS[-1]] = f"{assembly}\nSELECT trajectory_id, {checked}, cityHash64(*) FROM {STEPS[-1]}"
    params = audit_params(RUN_ID, window_s=config.window_s, verdict_timeout_s=config.assembly.verdict_timeout_s,
                          default_staleness_bound=config.default_staleness_bound)
    batches: list[Batch] = []
    for start in range(0, len(encoded), batch_size):
        accepted = accept(encoded, topics, start, min(start + batch_size, len(encoded)))
        sink.write(accepted, [])
        _, derive = _timed(deriver.derive, accepted)
        tids = sorted({str(t) for i in accepted if (t := getattr(i.event, "trajectory_id", None))})
        batch = Batch(len(tids), derive)
        bound = {**params, "tids": tids}
        results = {}
        for step, sql in queries.items():
            results[step], batch.steps[step] = _timed(client.query, sql, parameters=bound)
        computed = [row[:-1] for row in results[STEPS[-1]].result_rows]
        stored = _stored(client, database, tids)
        batch.records = len(computed)
        batch.differing = sum(1 for r in computed if stored.get(str(r[0])) != tuple(r[1:]))
        batches.append(batch)
        progress(f"  batch {len(batches)}: {len(tids):,} trajectories, Python derivation {derive[0]:.0f} ms, "
                 f"SQL records {batch.steps['traj'][0]:.0f} ms")
    return ProbeResult(len(encoded), batch_size, batches)


def _row(label: str, result: ProbeResult, times: Callable[[Batch], tuple[float, float]]) -> str:
    return f"{label:34s} {result.median(lambda b: times(b)[0]):9.0f} {result.median(lambda b: times(b)[1]):9.0f}"


def _step(name: str) -> Callable[[Batch], tuple[float, float]]:
    return lambda batch: batch.steps[name]


def report(result: ProbeResult) -> list[str]:
    """The probe's table: per-batch medians, wall and CPU, of the Python derivation and of each SQL step."""
    lines = [f"{result.events:,} bench events in {len(result.batches)} batches of {result.batch_size:,} "
             "(embedded engine, in-process; medians per batch, the first batch left out)",
             f"{'':34s} {'wall ms':>9s} {'CPU ms':>9s}",
             _row("Python derivation (all of it)", result, lambda b: b.derive)]
    lines += [_row(f"SQL up to `{step}`", result, _step(step)) for step in STEPS]
    trajectories = sum(b.trajectories for b in result.batches)
    records = sum(b.records for b in result.batches)
    differing = sum(b.differing for b in result.batches)
    lines.append(f"records: {records:,} from SQL for {trajectories:,} batch trajectories, "
                 f"{differing:,} differing from the Python derivation's in {', '.join(CHECKED)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.batch_sql_probe", description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=at_least(1000), default=150_000,
                        help="bench events to derive (default 150,000, the suite's replay log)")
    parser.add_argument("--batch-size", type=at_least(100), default=10_000,
                        help="events per batch (default 10,000, the worker's)")
    args = parser.parse_args(argv)
    tune_collector()
    with tempfile.TemporaryDirectory(prefix="batch-sql-probe-") as folder:
        client = connect(f"chdb://{folder}", database=DATABASE)
        result = run(client, DATABASE, args.events, args.batch_size)
    print("\n".join(report(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
