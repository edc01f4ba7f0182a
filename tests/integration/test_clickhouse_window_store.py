"""Metric windows on the real embedded engine: one row per window in, every contract view's rows out."""

from __future__ import annotations

import re
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from infra.clickhouse.client import Client
from infra.clickhouse.migrate import load_migrations, migrate
from schemas.events import InterruptReason, Termination, Verdict
from streams.derive import TRAJECTORY_COLUMNS, _record_row
from streams.metrics import Consumption, Row, RunConfig, WindowKey, breakdown_rows, window_rows
from streams.trajectory import EPOCH, TrajectoryRecord, VersionTimeline
from streams.window_store import COLUMNS, FAMILIES, TABLE, stored_windows, window_row, write_windows
from tests.unit.test_metrics import at, mixed_window, trajectory

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RUN = "run-unit"
T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
WINDOW_S = 60
CONFIG = RunConfig({"code": 3.0, "math": 1.0}, 2)

VIEW_OF = {
    "m_throughput": "v_effective_throughput",
    "m_timing": "v_timing",
    "m_budget": "v_budget",
    "m_snapshots": "v_snapshots",
    "m_env_failures": "v_env_failures",
    "m_domain_quality": "v_domain_quality",
    "m_policy_lag": "v_policy_lag",
    "m_interruptions": "v_interruptions",
    "m_verifier_integrity": "v_verifier_integrity",
    "m_undecidable": "v_undecidable",
    "m_environment_versions": "v_environment_versions",
}
"""The contract view that shows each family (its columns carry the family's field names)."""

WINDOW_VIEWS = (*VIEW_OF.values(), "v_windows")


def _records() -> list[TrajectoryRecord]:
    return [*mixed_window(), trajectory("other-env", environment_version="env-2"),
            trajectory("interrupted", interruptions=(InterruptReason.BUDGET,), snapshots=(10,), resumes=(True,))]


def _families(key: WindowKey, records: list[TrajectoryRecord]) -> dict[str, list[Row]]:
    consumptions = [(Consumption(RUN, "b", r.trajectory_id, 4, at(50)), r) for r in records[:3]]
    rows = window_rows(key, WINDOW_S, records, consumptions, CONFIG, VersionTimeline())
    rows.update(breakdown_rows(key, WINDOW_S, records))
    return rows


def _write(engine: Client, database: str, windows: list[tuple[WindowKey, int, dict[str, list[Row]]]]) -> None:
    write_windows(engine, database, [window_row(k, k.window_start + timedelta(seconds=WINDOW_S), v, f)
                                     for k, v, f in windows])


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return int((value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp())
    return value


def _view_rows(engine: Client, database: str, family: str, key: WindowKey) -> list[dict[str, Any]]:
    fields = next(f.fields for f in FAMILIES if f.family == family)
    columns = ["run_id", "domain", "window_start", "window_end", *fields]
    result = engine.query(
        f"SELECT {', '.join(columns)} FROM {database}.{VIEW_OF[family]} "
        "WHERE run_id = {run:String} AND domain = {domain:String} AND window_start = {start:DateTime('UTC')}",
        parameters={"run": key.run_id, "domain": key.domain, "start": key.window_start})
    return sorted(({c: _plain(v) for c, v in zip(columns, row, strict=True)} for row in result.result_rows), key=repr)


def _expected(rows: list[Row]) -> list[dict[str, Any]]:
    return sorted(({c: _plain(v) for c, v in row.items()} for row in rows), key=repr)


def test_the_table_has_the_columns_the_worker_writes(engine: Client, database: str) -> None:
    result = engine.query("SELECT name FROM system.columns WHERE database = {db:String} AND table = {t:String} "
                          "ORDER BY position", parameters={"db": database, "t": TABLE})
    assert [r[0] for r in result.result_rows] == list(COLUMNS)


def test_every_view_shows_the_families_of_a_window_as_written(engine: Client, database: str) -> None:
    key = WindowKey(RUN, "code", T0)
    families = _families(key, _records())
    assert all(families.values()), "every family has rows in this window"
    _write(engine, database, [(key, 10, families)])

    for family, rows in families.items():
        assert _view_rows(engine, database, family, key) == _expected(rows), family
    windows = engine.query(f"SELECT run_id, domain, window_start, version FROM {database}.v_windows").result_rows
    assert [(r, d, _plain(w), v) for r, d, w, v in windows] == [(RUN, "code", _plain(T0), 10)]


def test_a_newer_version_replaces_the_whole_window(engine: Client, database: str) -> None:
    key = WindowKey(RUN, "code", T0)
    before = _families(key, _records())
    after_records = [trajectory("only-v5", policy_version=5, environment_version="env-9", verifier_version="v2")]
    after = _families(key, after_records)
    _write(engine, database, [(key, 20, before)])
    _write(engine, database, [(key, 30, after)])
    _write(engine, database, [(key, 25, before)])  # a stale version arriving late never wins

    for attempt in ("unmerged", "merged"):
        for family, rows in after.items():
            assert _view_rows(engine, database, family, key) == _expected(rows), (attempt, family)
        classes = engine.query(f"SELECT count() FROM {database}.v_env_failures").result_rows
        assert classes == [(0,)], attempt  # the classes of version 20 left with it
        engine.command(f"OPTIMIZE TABLE {database}.{TABLE} FINAL")


def test_one_insert_writes_many_windows_and_empty_windows_keep_their_row(engine: Client, database: str) -> None:
    keys = [WindowKey(RUN, domain, T0 + timedelta(minutes=m)) for domain in ("code", "math") for m in range(3)]
    empty = WindowKey(RUN, "math", T0 + timedelta(minutes=10))
    other = WindowKey("other-run", "code", T0)
    _write(engine, database, [(k, i + 1, _families(k, _records())) for i, k in enumerate(keys)]
           + [(empty, 99, _families(empty, [])), (other, 100, _families(other, _records()))])

    assert stored_windows(engine, database, RUN) == {*keys, empty}
    assert stored_windows(engine, database, "nobody") == set()
    counts = dict(engine.query(
        f"SELECT domain, sum(finished) FROM {database}.v_effective_throughput WHERE run_id = {{run:String}} "
        "GROUP BY domain", parameters={"run": RUN}).result_rows)
    assert counts == {"code": 33, "math": 33}
    budget = engine.query(
        f"SELECT configured_weight, sandbox_share FROM {database}.v_budget WHERE run_id = {{run:String}} "
        "AND window_start = {start:DateTime('UTC')} ORDER BY domain", parameters={"run": RUN, "start": T0}).result_rows
    assert budget == [(0.75, pytest.approx(0.5)), (0.25, pytest.approx(0.5))]
    empty_row = engine.query(
        f"SELECT finished, env_validity_rate FROM {database}.v_effective_throughput "
        "WHERE run_id = {run:String} AND window_start = {start:DateTime('UTC')}",
        parameters={"run": RUN, "start": empty.window_start}).result_rows
    assert empty_row == [(0, None)]


def test_filters_on_a_view_narrow_the_read_of_the_table(engine: Client, database: str) -> None:
    key = WindowKey("r", "code", T0)
    _write(engine, database, [(key, 1, _families(key, _records()))])
    plan = "\n".join(r[0] for r in engine.query(
        f"EXPLAIN indexes = 1 SELECT count() FROM {database}.v_env_failures WHERE run_id = 'r' "
        "AND domain = 'code' AND window_start >= toDateTime('2026-01-01 00:00:00', 'UTC') AND origin = 'environment'"
    ).result_rows)
    assert f"ReadFromMergeTree ({database}.{TABLE})" in plan
    assert "FINAL: 1" in plan
    condition = next(line for line in plan.splitlines() if line.strip().startswith("Condition:"))
    assert "run_id" in condition and "window_start" in condition and "domain" in condition


NEWEST_RECORDS = """
SELECT * EXCEPT (finish_window, version)
FROM (SELECT * FROM {db}.trajectories ORDER BY version DESC LIMIT 1 BY run_id, trajectory_id)
WHERE status != 'superseded'
"""
"""The newest record of every trajectory, straight from every version stored (what v_trajectories must show)."""


def test_v_trajectories_shows_the_newest_record_of_every_trajectory(engine: Client, database: str) -> None:
    running = trajectory("moves", finish=None, outcome=None)
    first = trajectory("moves", finish=30)
    moved = trajectory("moves", finish=95)  # a later finish event: another window
    back = trajectory("gone", finish=30)
    rows = [
        _record_row(running, EPOCH, 1),  # unfinished: no tombstone is written when it finishes
        _record_row(first, T0, 2),
        _record_row(replace(first, status="superseded"), T0, 4),  # it moved: a tombstone in the old window
        _record_row(moved, T0 + timedelta(minutes=1), 5),
        _record_row(back, T0, 6),
        _record_row(replace(back, status="superseded"), T0, 7),  # its newest row is a tombstone: not shown
        *(_record_row(trajectory(f"plain-{i}", finish=10 * i), T0, 10 + i) for i in range(5)),
    ]
    engine.insert("trajectories", rows[:3], column_names=TRAJECTORY_COLUMNS, database=database)
    engine.insert("trajectories", rows[3:], column_names=TRAJECTORY_COLUMNS, database=database)

    expected = sorted(engine.query(NEWEST_RECORDS.format(db=database)).result_rows, key=repr)
    assert {r[2] for r in expected} == {"moves", *(f"plain-{i}" for i in range(5))}
    for attempt in ("unmerged", "merged"):
        shown = sorted(engine.query(f"SELECT * FROM {database}.v_trajectories").result_rows, key=repr)
        assert shown == expected, attempt
        engine.command(f"OPTIMIZE TABLE {database}.trajectories_latest FINAL")
    moves = engine.query(f"SELECT status, toUnixTimestamp(finished_at) FROM {database}.v_trajectories "
                         "WHERE run_id = {run:String} AND trajectory_id = 'moves'", parameters={"run": RUN}).result_rows
    assert moves == [("finished", _plain(T0 + timedelta(seconds=95)))]


def _documented_types(view: str) -> dict[str, str]:
    doc = (ROOT / "docs" / "sql.md").read_text()
    section = next(s for s in re.split(r"^(?=## )", doc, flags=re.M) if s.startswith(f"## `{view}`"))
    return {m.group(1): m.group(2) for m in re.finditer(r"^\|\s*`(\w+)`\s*\|\s*([^|]+?)\s*\|", section, re.M)}


@pytest.mark.parametrize("view", WINDOW_VIEWS)
def test_window_view_columns_have_the_documented_types(engine: Client, database: str, view: str) -> None:
    result = engine.query("SELECT name, type FROM system.columns WHERE database = {db:String} AND table = {t:String} "
                          "ORDER BY position", parameters={"db": database, "t": view})
    assert dict(result.result_rows) == _documented_types(view)


def test_upgrading_a_database_where_0002_was_applied(engine: Client) -> None:
    database = f"t_{uuid.uuid4().hex[:12]}"
    engine.command(f"CREATE DATABASE {database}")
    engine.command(f"CREATE TABLE {database}.schema_migrations (version UInt32, name String, checksum String, "
                   "applied_at DateTime64(3, 'UTC')) ENGINE = MergeTree ORDER BY version")
    old = [m for m in load_migrations() if m.version <= 2]
    for migration in old:
        for statement in migration.statements(database):
            engine.command(statement)
        engine.insert("schema_migrations", [[migration.version, migration.name, migration.checksum, datetime.now(UTC)]],
                      column_names=["version", "name", "checksum", "applied_at"], database=database)
    engine.command(f"INSERT INTO {database}.m_windows VALUES ('r', 'code', '2026-01-01 00:00:00', "
                   "'2026-01-01 00:01:00', 1)")
    engine.command(f"INSERT INTO {database}.trajectories (run_id, domain, trajectory_id, status, version) "
                   "VALUES ('r', 'code', 't1', 'queued', 1)")

    applied = migrate(engine, database)

    assert [m.version for m in applied] == [m.version for m in load_migrations() if m.version > 2]
    tables = {r[0] for r in engine.query("SELECT name FROM system.tables WHERE database = {db:String}",
                                         parameters={"db": database}).result_rows}
    assert not {t for t in tables if t.startswith("m_")} - {TABLE}
    assert {TABLE, *WINDOW_VIEWS, "v_trajectories", "v_alerts"} <= tables
    assert engine.query(f"SELECT count() FROM {database}.v_windows").result_rows == [(0,)]
    assert engine.query(f"SELECT trajectory_id FROM {database}.v_trajectories").result_rows == [("t1",)]
    key = WindowKey("r", "code", T0)
    _write(engine, database, [(key, 1, _families(key, [trajectory("t", outcome=Verdict.FAILED,
                                                                  termination=Termination.COMPLETED)]))])
    assert engine.query(f"SELECT finished, decided, passed FROM {database}.v_effective_throughput").result_rows == [
        (1, 1, 0)]
    assert migrate(engine, database) == []


def test_every_view_rewritten_by_0008_shows_what_0003s_definition_shows(engine: Client, database: str) -> None:
    # 0008 names the Nested subcolumns one by one in the ARRAY JOIN (so queries read only what they use);
    # the views' columns, types and rows must stay those of 0003's definitions.
    keys = [WindowKey(RUN, domain, T0 + timedelta(minutes=m)) for domain in ("code", "math") for m in range(3)]
    windows = [(key, 1, _families(key, _records())) for key in keys]
    windows.append((keys[0], 2, _families(keys[0], _records()[:2])))  # a newer version of one window
    _write(engine, database, windows)
    migrations = {m.version: m for m in load_migrations()}
    rewritten = [re.search(r"VIEW (\S+)\.(\w+) AS", s) for s in migrations[8].statements(database)]
    names = [m.group(2) for m in rewritten if m is not None]
    assert len(names) == 7
    for statement in migrations[3].statements(database):
        found = re.search(r"CREATE VIEW IF NOT EXISTS (\S+)\.(\w+) AS", statement)
        if found is not None and found.group(2) in names:
            engine.command(statement.replace(f"{found.group(1)}.{found.group(2)} AS",
                                             f"{found.group(1)}.old_{found.group(2)} AS", 1))
    for name in names:
        columns = [engine.query("SELECT name, type FROM system.columns WHERE database = {db:String} "
                                "AND table = {t:String} ORDER BY position",
                                parameters={"db": database, "t": view}).result_rows
                   for view in (name, f"old_{name}")]
        assert columns[0] == columns[1], name
        rows = [engine.query(f"SELECT * FROM {database}.{view} ORDER BY ALL").result_rows
                for view in (name, f"old_{name}")]
        assert rows[0] == rows[1] and rows[0], name
