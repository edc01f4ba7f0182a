"""Pure parts of the bulk replay: validation into plain tuples, window rows from the audit families' rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from schemas import TopicNames, encode_event
from streams import window_store
from streams.audit import FAMILIES
from streams.replay import WINDOW_FAMILIES, on_assembled, validate, window_rows
from tests.support.events import BASE_TIME, queued

RUN = "r1"


def test_validate_keeps_plain_values_of_valid_events_and_dead_letters_the_rest() -> None:
    topics = TopicNames("p")
    event = queued(7)
    raw = encode_event(event)
    valid, dead = validate([(raw, b"k", topics.sandbox, 2, 40), (b"{not json", None, topics.sandbox, 2, 41),
                            (raw, b"k", topics.policy, 0, 5)], "p", BASE_TIME + timedelta(hours=1))
    assert valid == [(event.event_id.int, event.run_id, raw.decode(), topics.sandbox, 2, 40)]
    assert [(d.reason, d.source.offset) for d in dead] == [("invalid_json", 41), ("wrong_topic", 5)]


def test_every_audit_family_has_a_window_family() -> None:
    assert set(WINDOW_FAMILIES) == {f.name for f in FAMILIES}
    assert set(WINDOW_FAMILIES.values()) == {f.family for f in window_store.FAMILIES}


@dataclass
class _Result:
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)


def _reader(rows: dict[str, _Result]) -> Any:
    def read(name: str) -> _Result:
        if name in rows:
            return rows[name]
        family = next(f for f in FAMILIES if f.sql_file == name)
        return _Result([c.name for c in family.columns])
    return read


def _epoch(minute: int) -> int:
    return int(datetime(2026, 1, 1, 0, minute, tzinfo=UTC).timestamp())


def test_window_rows_group_family_rows_by_window_and_fill_empty_windows() -> None:
    code, math = _epoch(1), _epoch(2)
    read = _reader({
        "windows.sql": _Result(["domain", "window_start"], [["code", code], ["math", math]]),
        "weights.sql": _Result(["domain", "configured_weight"], [["code", 0.75], ["math", 0.25]]),
        "throughput.sql": _Result(
            ["domain", "window_start", "finished", "env_valid", "decided", "passed", "undecidable",
             "digest_mismatches", "model_errors"], [["code", code, 5, 4, 3, 2, 1, 0, 1]]),
        "domain_quality.sql": _Result(["domain", "window_start", "policy_version", "decided", "passed"],
                                      [["code", code, 1, 2, 1], ["code", code, 2, 1, 1]]),
        "policy_lag_consumption.sql": _Result(
            ["domain", "window_start", "stage", "trajectories", "lag_versions_p50", "lag_versions_p95",
             "lag_versions_max", "lag_seconds_p50", "lag_seconds_p95", "lag_seconds_max", "over_bound",
             "staleness_bound"], [["math", math, "consumption", 3, 1.0, 2.0, 2.0, 5.0, 9.0, 9.5, 0, 2]]),
    })
    rows = window_rows(read, RUN, 60, 99)
    assert len(rows) == 2
    by_domain = {row[1]: dict(zip(window_store.COLUMNS, row, strict=True)) for row in rows}
    code_row, math_row = by_domain["code"], by_domain["math"]
    assert code_row["window_start"] == datetime.fromtimestamp(code, UTC)
    assert code_row["window_end"] == datetime.fromtimestamp(code, UTC) + timedelta(seconds=60)
    assert (code_row["finished"], code_row["decided"], code_row["model_errors"]) == (5, 3, 1)
    assert code_row["quality.policy_version"] == [1, 2] and code_row["quality.decided"] == [2, 1]
    # Families without rows in a window get the zero row the worker writes, budget's with the configured weight.
    assert (code_row["sandbox_seconds"], code_row["configured_weight"]) == (0.0, 0.75)
    # A window with a consumption only: zero rows for the one-row families, the weight from the run's config.
    assert (math_row["finished"], math_row["timing_finished"], math_row["configured_weight"]) == (0, 0, 0.25)
    assert math_row["wait_s_p50"] is None
    assert math_row["policy_lag.stage"] == ["consumption"] and math_row["policy_lag.over_bound"] == [0]
    assert math_row["quality.policy_version"] == []
    assert code_row["version"] == math_row["version"] == 99


def test_window_rows_refuse_family_rows_outside_the_windows() -> None:
    read = _reader({
        "windows.sql": _Result(["domain", "window_start"], []),
        "weights.sql": _Result(["domain", "configured_weight"], []),
        "throughput.sql": _Result(
            ["domain", "window_start", "finished", "env_valid", "decided", "passed", "undecidable",
             "digest_mismatches", "model_errors"], [["code", _epoch(1), 1, 1, 1, 1, 0, 0, 0]]),
    })
    with pytest.raises(ValueError, match="outside the run's windows"):
        window_rows(read, RUN, 60, 1)


def test_on_assembled_replaces_only_the_assembled_expressions() -> None:
    sql = "SELECT * FROM traj UNION ALL SELECT * FROM trajectories UNION ALL SELECT * FROM consumed"
    assert on_assembled(sql, "t_") == (
        "SELECT * FROM t_traj UNION ALL SELECT * FROM trajectories UNION ALL SELECT * FROM t_consumed")
