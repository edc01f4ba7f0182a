"""Alert rules evaluate as Grafana's reduce and threshold expressions would, on tables and time series."""

from __future__ import annotations

import math

import pytest

from dashboards import alerts
from dashboards.expressions import Frame, Series, evaluate_rule, frame_to_series, reduce_series, threshold


def test_a_numeric_table_becomes_one_labelled_number_per_row() -> None:
    frame = Frame(["run", "domain", "value"], ["LowCardinality(String)", "String", "Nullable(Float64)"],
                  [["r", "cad", 0.3], ["r", "code", None]])
    series = frame_to_series(frame)
    assert [(dict(s.labels), s.is_number) for s in series] == [
        ({"run": "r", "domain": "cad"}, True), ({"run": "r", "domain": "code"}, True)]
    assert series[0].values == [0.3] and math.isnan(series[1].values[0])


def test_a_table_needs_exactly_one_numeric_column() -> None:
    with pytest.raises(ValueError, match="exactly one numeric column"):
        frame_to_series(Frame(["a", "b"], ["UInt64", "Float64"], [[1, 2.0]]))


def test_a_long_time_series_is_split_by_labels_and_sorted_by_time() -> None:
    frame = Frame(["time", "domain", "v"], ["DateTime", "String", "UInt64"],
                  [["2026-01-01T00:01:00", "a", 2], ["2026-01-01T00:00:00", "a", 1], ["2026-01-01T00:00:00", "b", 5]])
    by_domain = {s.labels["domain"]: list(s.values) for s in frame_to_series(frame)}
    assert by_domain == {"a": [1.0, 2.0], "b": [5.0]}


@pytest.mark.parametrize(("reducer", "expected"), [
    ("last", 3.0), ("mean", 2.0), ("max", 3.0), ("min", 1.0), ("sum", 6.0), ("count", 3.0), ("median", 2.0)])
def test_reducers(reducer: str, expected: float) -> None:
    assert reduce_series(Series({}, [2.0, 1.0, 3.0]), reducer) == expected


def test_reduce_is_strict_about_nan_unless_told_otherwise_and_passes_numbers_through() -> None:
    series = Series({}, [1.0, math.nan, 3.0])
    assert math.isnan(reduce_series(series, "mean"))
    assert reduce_series(series, "mean", "dropNN") == 2.0
    assert reduce_series(series, "sum", "replaceNN") == 4.0
    assert reduce_series(Series({}, [7.0], is_number=True), "mean") == 7.0


@pytest.mark.parametrize(("kind", "params", "value", "fires"), [
    ("gt", [0.1], 0.1, False), ("gt", [0.1], 0.11, True),
    ("lt", [0.5], 0.5, False), ("lt", [0.5], 0.49, True),
    ("within_range", [1, 3], 1, False), ("within_range", [1, 3], 2, True),
    ("outside_range", [1, 3], 3, False), ("outside_range", [1, 3], 3.5, True),
    ("gt", [0], math.nan, False),
])
def test_threshold_types(kind: str, params: list[float], value: float, fires: bool) -> None:
    assert threshold(value, kind, params) is fires


def test_threshold_rejects_types_grafana_does_not_accept() -> None:
    with pytest.raises(ValueError):
        threshold(1.0, "gte", [1.0])


def _regression_rule() -> dict[str, object]:
    rules: list[dict[str, object]] = alerts.rules_file()["groups"][0]["rules"]
    return next(r for r in rules if r["uid"] == "rollout-domain-regression")


def test_a_rule_fires_per_instance_and_keeps_the_reduced_value() -> None:
    frame = Frame(["run", "domain", "pass_rate_drop"], ["String", "String", "Float64"],
                  [["demo", "cad", 0.25], ["demo", "code", 0.0]])
    instances = evaluate_rule(_regression_rule(), {"A": frame})
    assert [(dict(i.labels), i.state, i.value) for i in instances] == [
        ({"run": "demo", "domain": "cad"}, "Alerting", 0.25),
        ({"run": "demo", "domain": "code"}, "Normal", 0.0),
    ]


def test_no_rows_is_no_data_resolved_by_the_rules_no_data_state() -> None:
    empty = Frame(["run", "domain", "pass_rate_drop"], ["String", "String", "Float64"], [])
    rule = _regression_rule()
    assert [i.state for i in evaluate_rule(rule, {"A": empty})] == ["Normal"]  # noDataState OK
    assert [i.state for i in evaluate_rule({**rule, "noDataState": "Alerting"}, {"A": empty})] == ["Alerting"]
    assert [i.state for i in evaluate_rule({**rule, "noDataState": "NoData"}, {"A": empty})] == ["NoData"]
