"""The bulk replay's window rows (``streams.replay.window_metrics_select``) on the engine, from given family rows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from infra.clickhouse.client import EMBEDDED_SETTINGS, Client, join_settings
from streams import window_store
from streams.audit import FAMILIES, Family, Kind
from streams.replay import window_metrics_select

RUN = "r1"
CODE = int(datetime(2026, 1, 1, 0, 1, tzinfo=UTC).timestamp())
MATH = int(datetime(2026, 1, 1, 0, 2, tzinfo=UTC).timestamp())
TYPES = {Kind.INT: "UInt64", Kind.FLOAT: "Nullable(Float64)", Kind.TEXT: "String", Kind.TIME: "Int64"}


def _rows(family: Family, rows: list[tuple[Any, ...]]) -> str:
    """The family's columns (its audit query's) holding ``rows``, or none."""
    structure = ", ".join(f"{c.name} {TYPES[c.kind]}" for c in family.columns)
    if not rows:
        zeros = ", ".join(f"defaultValueOfTypeName('{TYPES[c.kind]}') AS {c.name}" for c in family.columns)
        return f"SELECT {zeros} WHERE 0"
    values = ", ".join(repr(row).replace("None", "NULL") for row in rows)
    return f"SELECT * FROM VALUES('{structure}', {values})"


GIVEN: dict[str, list[tuple[Any, ...]]] = {
    "throughput.sql": [("code", CODE, 5, 4, 3, 2, 1, 0, 1)],
    "domain_quality.sql": [("code", CODE, 1, 2, 1), ("code", CODE, 2, 1, 1)],
    "policy_lag_consumption.sql": [("math", MATH, "consumption", 3, 1.0, 2.0, 2.0, 5.0, 9.0, 9.5, 0, 2)],
    "policy_lag_finish.sql": [("code", CODE, "finish", 2, 0.0, 1.0, 1.0, None, None, None, 0, 2)],
}


def _source(name: str) -> str:
    if name == "windows.sql":
        return f"SELECT * FROM VALUES('domain String, window_start Int64', ('code', {CODE}), ('math', {MATH}))"
    if name == "weights.sql":
        return "SELECT * FROM VALUES('domain String, configured_weight Float64', ('code', 0.75), ('math', 0.25))"
    family = next(f for f in FAMILIES if f.sql_file == name)
    return _rows(family, GIVEN.get(name, []))


def test_window_rows_group_family_rows_by_window_and_fill_empty_windows(engine: Client, database: str) -> None:
    columns = ", ".join(f"`{c}`" for c in window_store.COLUMNS)
    engine.command(f"INSERT INTO `{database}`.{window_store.TABLE} ({columns})\n{window_metrics_select(_source)}",
                   parameters={"run": RUN, "window_s": 60, "version": 99})
    result = engine.query(f"SELECT {columns} FROM `{database}`.{window_store.TABLE} ORDER BY domain")
    by_domain = {row[1]: dict(zip(window_store.COLUMNS, row, strict=True)) for row in result.result_rows}
    assert sorted(by_domain) == ["code", "math"]
    code, math = by_domain["code"], by_domain["math"]
    assert code["run_id"] == math["run_id"] == RUN
    start, end = (code[c].replace(tzinfo=UTC) for c in ("window_start", "window_end"))  # read back without a zone
    assert start == datetime.fromtimestamp(CODE, UTC) and end == start + timedelta(seconds=60)
    assert (code["finished"], code["decided"], code["model_errors"]) == (5, 3, 1)
    assert sorted(zip(code["quality.policy_version"], code["quality.decided"], strict=True)) == [(1, 2), (2, 1)]
    # A multi-row family's NULL fields keep their place in the arrays.
    assert code["policy_lag.stage"] == ["finish"] and code["policy_lag.lag_seconds_p50"] == [None]
    assert code["policy_lag.lag_versions_p95"] == [1.0]
    # Families without rows in a window get the zero row the worker writes, budget's with the configured weight.
    assert (code["sandbox_seconds"], code["configured_weight"], code["snapshots"]) == (0.0, 0.75, 0)
    assert code["wait_s_p50"] is None and code["env_failures.origin"] == []
    # A window with a consumption only: zero rows for the one-row families, the weight from the run's config.
    assert (math["finished"], math["timing_finished"], math["configured_weight"]) == (0, 0, 0.25)
    assert math["wait_s_p50"] is None
    assert math["policy_lag.stage"] == ["consumption"] and math["policy_lag.over_bound"] == [0]
    assert math["policy_lag.lag_seconds_max"] == [9.5]
    assert math["quality.policy_version"] == []
    assert code["version"] == math["version"] == 99


def test_the_window_join_runs_without_the_query_condition_cache(engine: Client) -> None:
    # The embedded engine (ClickHouse 26.9) knows both settings; a server that knows neither gets none.
    assert join_settings(engine) == EMBEDDED_SETTINGS


class _OlderServer:
    def query(self, sql: str, parameters: dict[str, Any]) -> Any:
        assert "system.settings" in sql
        known = [name for name in parameters["names"] if name == "use_query_condition_cache"]
        return type("Result", (), {"result_rows": [(name,) for name in known]})()


def test_join_settings_leave_out_what_the_server_does_not_know() -> None:
    assert join_settings(_OlderServer()) == {"use_query_condition_cache": 0}
