"""The bulk-replay probe: its families on the assembly materialised once equal the audit's own queries."""

from __future__ import annotations

from typing import Any

from bench.bulk_probe import RUN_ID, SKIPPED, assemble, bench_log, families, load, on_assembled, probe_params
from infra.clickhouse.client import Client
from infra.clickhouse.reader import run_read
from rollout.settings import Settings
from streams.audit import FAMILIES, SQL_DIR, audit_sql
from streams.replay import ASSEMBLED, ON_DISK, materialise, trajectory_parts


def _sorted(rows: list[list[Any]]) -> list[tuple[str, ...]]:
    return sorted(tuple(repr(v) for v in row) for row in rows)


def test_families_on_the_assembled_tables_equal_the_audit_queries(engine: Client, database: str) -> None:
    previous = engine.database
    engine.database = database
    try:
        loaded = load(engine, database, bench_log(3_000), 1_000, beside=True)
        params = probe_params(Settings())
        assembled = assemble(engine, params)
        derived = families(engine, params)
        stored = engine.query(f"SELECT count() FROM {database}.events_raw").result_rows[0][0]
        assert 0 < loaded["accepted"] <= loaded["messages"]
        assert 0 < stored <= loaded["accepted"]  # duplicate deliveries may be merged away; the audit dedupes
        assert assembled["config"][1] == 1 and assembled["traj"][1] > 0 and assembled["consumption"][1] > 0
        assert assembled["consumed"][1] >= assembled["consumption"][1]
        files = [p for p in sorted(SQL_DIR.glob("*.sql")) if p.name not in SKIPPED]
        assert sorted(derived) == [p.stem for p in files]
        # The replay writes one window row per window of windows.sql, each family joined to it: no family has
        # rows in another window.
        windows = {(r[0], r[1]) for r in run_read(engine, audit_sql("windows.sql"), params).rows}
        for family in FAMILIES:
            keys = {(r[0], r[1]) for r in run_read(engine, on_assembled(audit_sql(family.sql_file)), params).rows}
            assert keys and keys <= windows, family.name
        for path in files:
            sql = path.read_text()
            assert on_assembled(sql) != sql  # every family reads the assembled tables, not the CTEs again
            expected = run_read(engine, audit_sql(path.name), params).rows
            actual = run_read(engine, on_assembled(audit_sql(path.name)), params).rows
            assert derived[path.stem][1] == len(expected), path.name
            assert _sorted(actual) == _sorted(expected), path.name
        # A run folded part by part (by trajectory id, as a large run is) gives the same tables as in one part.
        events = int(engine.query(f"SELECT count() FROM {database}.events_raw").result_rows[0][0])
        assert trajectory_parts(engine, database, RUN_ID, events) == [("", "")]  # a small run: one part
        parts = trajectory_parts(engine, database, RUN_ID, events, per_part=-(-events // 4))  # 4 parts
        assert len(parts) == 4 and parts[0][0] == "" and parts[-1][1] == ""
        assert all(low < high for low, high in parts[1:-1]) and parts[0][1] == parts[1][0]
        materialise(engine, database, params, "parts_", engine=ON_DISK, parts=parts)
        for name in ASSEMBLED:
            one, parted = (_sorted(engine.query(f"SELECT * FROM {prefix}{name}").result_rows)
                           for prefix in ("a_", "parts_"))
            assert one and parted == one, name
    finally:
        engine.database = previous


def test_only_the_assembled_expressions_are_replaced() -> None:
    sql = ("SELECT 1 FROM traj WHERE x IN (SELECT y FROM consumption) UNION ALL SELECT 2 FROM trajectories "
           "UNION ALL SELECT 3 FROM consumed")
    assert on_assembled(sql) == (
        "SELECT 1 FROM a_traj WHERE x IN (SELECT y FROM a_consumption) UNION ALL SELECT 2 FROM trajectories "
        "UNION ALL SELECT 3 FROM a_consumed")
    assert on_assembled("SELECT 1 FROM raw, events_raw") == "SELECT 1 FROM a_raw, events_raw"
    assert ASSEMBLED == ("raw", "folded", "config", "traj", "consumed", "consumption")
    assert on_assembled("(SELECT weights FROM config) AS w") == "(SELECT weights FROM a_config) AS w"
