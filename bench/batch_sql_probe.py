"""What the engine would cost to derive each batch's trajectory records and window metrics, beside the worker's Python
derivation.

The worker derives in Python, batch by batch (``streams.derive``); the bulk replay derives in the
engine, once per run (``streams.replay``). Would the engine, asked per batch for the batch's
trajectories only, be cheaper than Python and so lift the worker's rate? This probe answers with
most of such a derivation. In-process on the embedded engine, without Kafka, the bench's
events go through the worker's steps in its batches: ``streams.records.classify``,
``ClickHouseSink.write`` and ``Deriver.derive``, the last one timed (the whole Python derivation:
records, windows, consumptions, alerts and every write). After each batch, the audit's assembly
(``streams/audit_sql/assembly.sql``), limited to the batch's trajectories and the run's events
without one (policy versions, configuration), is asked for three of its steps, each as a query of
its own: the events parsed (``raw``), their fold per trajectory (``folded``) and the trajectory
records (``traj``). Each is timed by the wall clock and by the process's CPU (the engine's threads
included). The records ``traj`` computes are checked against the ones the Python derivation stored.
Only the worker's own steps write to the probe's database.
Then the **derivation** step, each part timed: the windows the batch touched (where its
trajectories finished, and where its consumptions fall) and every trajectory finished or consumed
in them are found from the stored records and consumptions; the assembly of those trajectories is
materialised once, as the bulk replay does (``streams.replay.materialise``); the batch's records
(``streams/replay_sql/trajectories.sql``) and every family's rows of those windows
(``streams.replay.window_metrics_select``) are written as the bulk replay writes them, into a
database of the probe's own with the same tables (``<database>_writes``, dropped at the end); the
batch's records are read back, as derived messages would need them. The window rows written are
checked against the ``m_window_metrics`` rows the Python derivation stored (every column but the
version; a multi-row family as a set of rows, floats as the audit compares them). That step is the engine's whole
derivation of the batch but its consumptions and alerts.

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
from streams import window_store
from streams.app import derive_config
from streams.audit import Kind, audit_file, audit_params, values_equal
from streams.collector import tune_collector
from streams.derive import Deriver
from streams.replay import (
    drop_materialised,
    materialise,
    no_insert_merge,
    on_assembled,
    replay_sql,
    window_metrics_select,
)
from streams.sink_clickhouse import ClickHouseSink
from streams.state import OwnerState
from streams.trajectory import window_start

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

TEMP_PREFIX = "probe_tmp_"
"""Name prefix of the tables the derivation step materialises the assembly into (and drops)."""
DERIVATION = "derivation"
"""The probe's last step: the engine's derivation of the batch but its consumptions and alerts, from one assembly of
the trajectories the batch's windows hold (the batch's and the others finished or consumed in them)."""
DERIVATION_PARTS = ("find the windows", "assembly", "records written", "window rows written", "records read back")
"""The parts of the DERIVATION step: the windows the batch touched and the trajectories they hold (from the stored
records and consumptions); the assembly of those trajectories materialised; the batch's records and the windows' rows
written (into a database of their own, the probe's ``<database>_writes``, with the same tables and materialized
views); the batch's records read back, as the derived messages would need them."""

LATEST = "{db}.trajectories_latest FINAL WHERE run_id = {{run:String}} AND status = 'finished'"
FINISHED_SQL = ("SELECT trajectory_id, domain, toInt64(toUInt32(finish_window)) FROM " + LATEST +
                " AND trajectory_id IN (SELECT arrayJoin({{named:Array(String)}}))")
"""Domain and window of each finished trajectory the batch's events name (the records the Python derivation has just
stored): the batch's own trajectories' windows, and the domain of each consumption's window."""
MEMBERS_SQL = ("SELECT trajectory_id FROM " + LATEST + " AND (domain, toInt64(toUInt32(finish_window))) IN "
               "(SELECT arrayJoin({{dirty:Array(Tuple(String, Int64))}}))"
               " UNION DISTINCT SELECT trajectory_id FROM {db}.consumptions WHERE run_id = {{run:String}}"
               " AND intDiv(toInt64(toUnixTimestamp(consumed_at)), {{window_s:UInt32}}) * {{window_s:UInt32}}"
               " IN (SELECT arrayJoin({{starts:Array(Int64)}}))")
"""Every trajectory finished in one of the windows, or consumed in a window starting when one of them does."""
STORED_WINDOWS_SQL = ("SELECT {columns} FROM {db}." + window_store.TABLE + " FINAL WHERE run_id = {{run:String}} "
                      "AND (domain, toInt64(toUInt32(window_start))) IN "
                      "(SELECT arrayJoin({{dirty:Array(Tuple(String, Int64))}}))")


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
    windows: int = 0
    window_trajectories: int = 0
    windows_differing: int = 0
    records_written: int = 0


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


def windows_select(assembly: str) -> str:
    """``assembly`` followed by the replay's window rows (``streams.replay.window_metrics_select``), limited to the
    windows in ``{dirty:Array(Tuple(String, Int64))}``."""
    def source(name: str) -> str:
        sql = audit_file(name)
        if name != "windows.sql":
            return sql
        return (f"SELECT * FROM (\n{sql}\n) "
                "WHERE (domain, window_start) IN (SELECT arrayJoin({dirty:Array(Tuple(String, Int64))}))")

    return on_assembled(f"{assembly}\n{window_metrics_select(source)}", TEMP_PREFIX)


def records_insert(scratch: str) -> str:
    """The bulk replay's INSERT of trajectory records (``streams/replay_sql/trajectories.sql``) into ``scratch``, from
    the materialised assembly, limited to the trajectories in ``{batch:Array(String)}``."""
    sql = on_assembled(replay_sql("trajectories.sql"), TEMP_PREFIX)
    if "INSERT INTO trajectories\n" not in sql or not sql.rstrip().endswith(f"FROM {TEMP_PREFIX}traj"):
        raise RuntimeError("streams/replay_sql/trajectories.sql changed its shape; update bench/batch_sql_probe.py")
    return (sql.replace("INSERT INTO trajectories\n", f"INSERT INTO `{scratch}`.trajectories\n", 1).rstrip()
            + "\nWHERE trajectory_id IN (SELECT arrayJoin({batch:Array(String)}))")


def _engine_derivation(client: Any, database: str, scratch: str, sql: dict[str, str], params: dict[str, Any],
                       consumed: list[tuple[str, int]], version: int, steps: dict[str, tuple[float, float]]
                       ) -> tuple[list[tuple[Any, ...]], list[tuple[str, int]], int, int]:
    """The engine's derivation of one batch but its consumptions and alerts: the window rows it wrote, the windows,
    how many trajectories they hold and how many records it wrote; the time of each part in ``steps``
    (DERIVATION_PARTS). ``sql``: the assembly, the records' INSERT and the window rows' SELECT; ``consumed``:
    (trajectory, start of its window in epoch seconds) of each consumption the batch's events name."""
    def find() -> tuple[list[tuple[str, int]], list[str]]:
        named = sorted(set(params["tids"]) | {t for t, _ in consumed})
        finished = {str(t): (str(d), int(w)) for t, d, w in client.query(
            FINISHED_SQL.format(db=database), parameters={**params, "named": named}).result_rows}
        dirty = {finished[t] for t in params["tids"] if t in finished}
        dirty.update((finished[t][0], at) for t, at in consumed if t in finished)
        windows = sorted(dirty)
        found = client.query(MEMBERS_SQL.format(db=database),
                             parameters={**params, "dirty": windows, "starts": sorted({w for _, w in windows})})
        return windows, sorted({str(r[0]) for r in found.result_rows} | set(params["tids"]))

    (windows, members), steps[DERIVATION_PARTS[0]] = _timed(find)
    bound = {**params, "tids": members, "batch": params["tids"], "dirty": windows, "version": version}
    columns = ", ".join(f"`{c}`" for c in window_store.COLUMNS)
    written = f"WHERE run_id = {{run:String}} AND version = {version}"
    try:
        with no_insert_merge(client):  # as the bulk replay writes: each sorting key once per insert
            # As the bulk replay does: the assembly materialised once, not again by every family that reads it.
            _, steps[DERIVATION_PARTS[1]] = _timed(materialise, client, database, bound, TEMP_PREFIX,
                                                   assembly=sql["assembly"])
            _, steps[DERIVATION_PARTS[2]] = _timed(client.command, sql["records"], parameters=bound)
            _, steps[DERIVATION_PARTS[3]] = _timed(
                client.command, f"INSERT INTO `{scratch}`.{window_store.TABLE} ({columns})\n{sql['windows']}",
                parameters=bound)
        records, steps[DERIVATION_PARTS[4]] = _timed(
            client.query, f"SELECT * FROM `{scratch}`.trajectories {written}", parameters=bound)
    finally:
        drop_materialised(client, database, TEMP_PREFIX)
    rows = client.query(f"SELECT {columns} FROM `{scratch}`.{window_store.TABLE} {written}", parameters=bound)
    # The version (last column) is the writer's.
    return [tuple(r[:-1]) for r in rows.result_rows], windows, len(members), len(records.result_rows)


def _normalised(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A window row (``window_store.COLUMNS`` but the version) with each multi-row family as its rows sorted: the
    engine's ``groupArray`` keeps no order, the Python derivation writes them in its own."""
    values = dict(zip(window_store.COLUMNS, row, strict=False))
    out: list[Any] = [values[c] for c in window_store.KEY_COLUMNS]
    for family in window_store.FAMILIES:
        columns = [values[c] for c in family.columns()]
        out.append(columns if isinstance(family, window_store.Single) else sorted(zip(*columns, strict=True), key=repr))
    return tuple(out)


def _same(a: Any, b: Any) -> bool:
    """Equal values, floats as the audit compares them (``streams.audit.values_equal``: the engine and Python may round
    the last bits apart)."""
    if isinstance(a, float) or isinstance(b, float):
        return values_equal(a, b, Kind.FLOAT)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _windows_differing(client: Any, database: str, computed: list[tuple[Any, ...]], windows: list[tuple[str, int]],
                       run_id: str) -> int:
    """How many of the SQL window rows differ from the ones the Python derivation stored (or are not stored)."""
    columns = ", ".join(f"`{c}`" for c in window_store.COLUMNS[:-1])
    stored = client.query(STORED_WINDOWS_SQL.format(columns=columns, db=database),
                          parameters={"run": run_id, "dirty": windows}).result_rows
    by_key = {(str(r[1]), r[2]): _normalised(tuple(r)) for r in stored}
    return sum(1 for row in computed if not _same(by_key.get((str(row[1]), row[2])), _normalised(row)))


def run(client: Any, database: str, events: int, batch_size: int, progress: Any = log) -> ProbeResult:
    """Validate, store and derive ``events`` bench events in batches of ``database`` (the client's current one); after
    each, time the SQL steps on its trajectories."""
    migrate(client, database)
    scratch = f"{database}_writes"
    migrate(client, scratch)  # where the engine's derivation writes: the same tables and materialized views
    try:
        return _run(client, database, scratch, events, batch_size, progress)
    finally:
        client.command(f"DROP DATABASE IF EXISTS `{scratch}`")


def _run(client: Any, database: str, scratch: str, events: int, batch_size: int, progress: Any) -> ProbeResult:
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
    engine_sql = {"assembly": assembly, "records": records_insert(scratch), "windows": windows_select(assembly)}
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
        consumed = [(str(t), int(window_start(i.event.occurred_at, config.window_s).timestamp())) for i in accepted
                    for t in getattr(i.event, "trajectory_ids", ())]
        (rows, windows, batch.window_trajectories, batch.records_written), batch.steps[DERIVATION] = _timed(
            _engine_derivation, client, database, scratch, engine_sql, bound, consumed, len(batches) + 1,
            batch.steps)
        batch.windows = len(rows)
        batch.windows_differing = _windows_differing(client, database, rows, windows, RUN_ID) + len(windows) - len(rows)
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
    lines.append(_row("SQL derivation (own assembly)", result, _step(DERIVATION)))
    lines += [_row(f"  {part}", result, _step(part)) for part in DERIVATION_PARTS]
    trajectories = sum(b.trajectories for b in result.batches)
    records = sum(b.records for b in result.batches)
    differing = sum(b.differing for b in result.batches)
    lines.append(f"records: {records:,} from SQL for {trajectories:,} batch trajectories, "
                 f"{differing:,} differing from the Python derivation's in {', '.join(CHECKED)}")
    windows = sum(b.windows for b in result.batches)
    members = sum(b.window_trajectories for b in result.batches)
    windows_differing = sum(b.windows_differing for b in result.batches)
    written = sum(b.records_written for b in result.batches)
    lines.append(f"window rows: {windows:,} from SQL (the batches' windows, {members:,} trajectories assembled for "
                 f"them), {windows_differing:,} differing from the Python derivation's in any column but the version; "
                 f"{written:,} records written")
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
