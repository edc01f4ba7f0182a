"""The wide row of a metric window (pure): every family's rows in, the same rows back out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from schemas.events import InterruptReason
from streams.metrics import Consumption, RunConfig, WindowKey, breakdown_rows, window_rows
from streams.trajectory import VersionTimeline
from streams.window_store import (
    COLUMNS,
    FAMILIES,
    KEY_COLUMNS,
    Multi,
    Single,
    WindowShapeError,
    family_rows,
    window_row,
)
from tests.unit.test_metrics import at, mixed_window, trajectory

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
KEY = WindowKey("run-unit", "code", T0)
END = T0 + timedelta(seconds=60)


def _families() -> dict[str, list[dict[str, Any]]]:
    records = [*mixed_window(), trajectory("other-env", environment_version="env-2"),
               trajectory("interrupted", interruptions=(InterruptReason.BUDGET,), snapshots=(10,), resumes=(True,))]
    consumptions = [(Consumption("run-unit", "b", r.trajectory_id, 4, at(50)), r) for r in records[:3]]
    rows = window_rows(KEY, 60, records, consumptions, RunConfig({"code": 1.0}, 2), VersionTimeline())
    rows.update(breakdown_rows(KEY, 60, records))
    return rows


def test_every_family_of_a_window_has_columns() -> None:
    assert {f.family for f in FAMILIES} == set(_families())
    assert len(set(COLUMNS)) == len(COLUMNS)
    assert COLUMNS[:4] == KEY_COLUMNS and COLUMNS[-1] == "version"


def test_a_window_round_trips_through_its_row() -> None:
    families = _families()
    assert all(families[f.family] for f in FAMILIES), "every family has rows in this window"

    row = window_row(KEY, END, 7, families)

    assert len(row) == len(COLUMNS)
    stored = dict(zip(COLUMNS, row, strict=True))
    assert stored["version"] == 7 and stored["window_end"] == END
    assert family_rows(stored) == families
    assert stored["timing_finished"] == stored["finished"] == 11
    assert stored["env_failures.failure_class"] == ["dependency_unreachable", "invalid_tool_call"]
    assert stored["quality.policy_version"] == [3, 4]


def test_an_empty_window_has_one_row_with_empty_arrays() -> None:
    families = window_rows(KEY, 60, [], [], RunConfig({}, 2), VersionTimeline())
    families.update(breakdown_rows(KEY, 60, []))

    stored = dict(zip(COLUMNS, window_row(KEY, END, 1, families), strict=True))

    assert stored["finished"] == 0 and stored["configured_weight"] == 0.0
    for family in FAMILIES:
        if isinstance(family, Multi):
            assert all(stored[c] == [] for c in family.columns()), family.family
    assert family_rows(stored) == families


@pytest.mark.parametrize(("change", "message"), [
    (lambda f: f.pop("m_policy_lag"), "m_policy_lag missing"),
    (lambda f: f.update(m_new_family=[]), "no columns for"),
    (lambda f: f["m_env_failures"][0].update(extra=1), "fields"),
    (lambda f: f["m_throughput"][0].pop("passed"), "fields"),
    (lambda f: f["m_timing"].append(dict(f["m_timing"][0])), "has 2 rows, not 1"),
    (lambda f: f["m_domain_quality"][0].update(window_start=T0 + timedelta(seconds=60)), "window_start"),
    (lambda f: f["m_budget"][0].update(domain="math"), "domain"),
])
def test_rows_that_do_not_fit_the_table_are_refused(change: Any, message: str) -> None:
    families = _families()
    change(families)

    with pytest.raises(WindowShapeError, match=message):
        window_row(KEY, END, 1, families)


def test_single_and_multi_name_their_columns() -> None:
    assert Single("f", ("a", "b"), renamed=(("a", "f_a"),)).columns() == ["f_a", "b"]
    assert Multi("f", "n", ("a", "b")).columns() == ["n.a", "n.b"]
