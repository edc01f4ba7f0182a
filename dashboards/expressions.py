"""Evaluate an alert rule's server-side expressions (reduce, threshold) on query results, as Grafana does.

Grafana turns a data-source result into series or numbers before the expressions run:

- a frame with a time column is a time series; each string column is a label, each numeric
  column a series (long format: one series per distinct label set and numeric column);
- a frame without a time column is a *numeric table*: exactly one numeric column, the other
  columns strings; each row is one number whose labels are the row's strings.

``reduce`` turns each series into one number (``last``, ``mean``, ``max``, ``min``, ``sum``,
``count``, ``median``; a number passes through unchanged); ``threshold`` turns each number into
1 (firing) or 0. A rule whose query gave nothing is NoData, resolved by its ``noDataState``.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "Frame",
    "Instance",
    "Series",
    "evaluate_rule",
    "frame_to_series",
    "reduce_series",
    "threshold",
]

State = Literal["Alerting", "Normal", "NoData", "Error"]


@dataclass(frozen=True, slots=True)
class Frame:
    """One query result: column names, ClickHouse type names, rows."""

    columns: Sequence[str]
    types: Sequence[str]
    rows: Sequence[Sequence[Any]]


@dataclass(frozen=True, slots=True)
class Series:
    """Values (in time order) with their labels; a number is a series of one value."""

    labels: Mapping[str, str]
    values: Sequence[float]
    is_number: bool = False


@dataclass(frozen=True, slots=True)
class Instance:
    """One alert instance after evaluation: its labels, the reduced value, and its state."""

    labels: Mapping[str, str]
    value: float | None
    state: State
    values: Mapping[str, float] = field(default_factory=dict)


def _base_type(clickhouse_type: str) -> str:
    text = clickhouse_type.strip()
    for wrapper in ("Nullable(", "LowCardinality("):
        while text.startswith(wrapper) and text.endswith(")"):
            text = text[len(wrapper):-1].strip()
    return text


def _kind(clickhouse_type: str) -> Literal["time", "number", "string", "other"]:
    base = _base_type(clickhouse_type)
    if base.startswith(("DateTime", "Date")):
        return "time"
    if re.match(r"^(U?Int\d+|Float\d+|Decimal)", base):
        return "number"
    if base.startswith(("String", "FixedString", "Enum", "UUID")):
        return "string"
    return "other"


def _number(value: Any) -> float:
    if value is None:
        return math.nan
    return float(value)


def frame_to_series(frame: Frame) -> list[Series]:
    """Series (time series frames) or numbers (numeric tables) with labels, as Grafana converts them."""
    kinds = [_kind(t) for t in frame.types]
    numeric = [i for i, k in enumerate(kinds) if k == "number"]
    strings = [i for i, k in enumerate(kinds) if k == "string"]
    times = [i for i, k in enumerate(kinds) if k == "time"]
    if not frame.rows:
        return []
    if not times:
        if len(numeric) != 1:
            raise ValueError(
                f"a table without a time column must have exactly one numeric column, got {len(numeric)} "
                f"({', '.join(frame.columns)})"
            )
        (value_at,) = numeric
        return [
            Series({frame.columns[i]: str(row[i]) for i in strings}, [_number(row[value_at])], is_number=True)
            for row in frame.rows
        ]
    time_at = times[0]
    grouped: dict[tuple[tuple[str, str], ...], list[tuple[Any, float]]] = {}
    for row in frame.rows:
        labels = tuple((frame.columns[i], str(row[i])) for i in strings)
        for i in numeric:
            key = ((*labels, ("__field__", frame.columns[i])) if len(numeric) > 1 else labels)
            grouped.setdefault(key, []).append((row[time_at], _number(row[i])))
    out = []
    for key, points in grouped.items():
        points.sort(key=lambda p: str(p[0]))
        out.append(Series(dict(key), [v for _, v in points]))
    return out


_REDUCERS: dict[str, Callable[[Sequence[float]], float]] = {
    "last": lambda v: v[-1],
    "mean": lambda v: sum(v) / len(v),
    "max": max,
    "min": min,
    "sum": lambda v: float(sum(v)),
    "count": lambda v: float(len(v)),
    "median": lambda v: float(statistics.median(v)),
}


def reduce_series(series: Series, reducer: str, mode: str = "strict") -> float:
    """One number from a series; strict mode gives NaN when any value is NaN (Grafana's default)."""
    if series.is_number:
        return series.values[0] if series.values else math.nan
    if reducer not in _REDUCERS:
        raise ValueError(f"reducer {reducer!r} is not supported")
    values = list(series.values)
    if mode == "dropNN":
        values = [v for v in values if not math.isnan(v)]
    elif mode == "replaceNN":
        values = [0.0 if math.isnan(v) else v for v in values]
    elif any(math.isnan(v) for v in values):
        return math.nan
    if not values:
        return math.nan if reducer != "count" else 0.0
    return float(_REDUCERS[reducer](values))


def threshold(value: float, evaluator: str, params: Sequence[float]) -> bool:
    """Grafana's threshold evaluator: ``gt``, ``lt``, ``within_range`` (open), ``outside_range`` (open)."""
    if math.isnan(value):
        return False
    if evaluator == "gt":
        return value > params[0]
    if evaluator == "lt":
        return value < params[0]
    if evaluator == "within_range":
        low, high = sorted(params[:2])
        return low < value < high
    if evaluator == "outside_range":
        low, high = sorted(params[:2])
        return value < low or value > high
    raise ValueError(f"threshold type {evaluator!r} is not supported (gt, lt, within_range, outside_range)")


def _label_key(labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k != "__field__"))


def evaluate_rule(rule: Mapping[str, Any], results: Mapping[str, Frame]) -> list[Instance]:
    """Alert instances of a rule (file or API shape) given each data query's result, by refId.

    Supports the pipeline this project writes: data queries, then ``reduce`` and ``threshold``
    expressions in any chain; the condition names the last one.
    """
    values: dict[str, dict[tuple[tuple[str, str], ...], tuple[Mapping[str, str], float]]] = {}
    series_by_ref: dict[str, list[Series]] = {}
    for item in rule["data"]:
        ref = item["refId"]
        model = item["model"]
        if item.get("datasourceUid") != "__expr__":
            series_by_ref[ref] = frame_to_series(results[ref])
            continue
        kind = model.get("type")
        source = model["expression"].lstrip("$")
        if kind == "reduce":
            mode = (model.get("settings") or {}).get("mode", "strict") or "strict"
            values[ref] = {
                _label_key(s.labels): (s.labels, reduce_series(s, model["reducer"], mode))
                for s in series_by_ref.get(source, [])
            }
        elif kind == "threshold":
            evaluator = model["conditions"][0]["evaluator"]
            upstream = values.get(source)
            if upstream is None:
                upstream = {
                    _label_key(s.labels): (s.labels, reduce_series(s, "last"))
                    for s in series_by_ref.get(source, []) if s.is_number
                }
            values[ref] = {
                key: (labels, 1.0 if threshold(v, evaluator["type"], evaluator["params"]) else 0.0)
                for key, (labels, v) in upstream.items()
            }
        else:
            raise ValueError(f"expression type {kind!r} is not supported here")
    condition = rule["condition"]
    outcome = values.get(condition, {})
    if not outcome:
        no_data = rule.get("noDataState", "NoData")
        states: dict[str, State] = {"OK": "Normal", "Alerting": "Alerting", "KeepLast": "Normal"}
        state: State = states.get(no_data, "NoData")
        return [Instance({}, None, state)]
    instances = []
    for key, (labels, fired) in sorted(outcome.items()):
        per_ref = {ref: v[key][1] for ref, v in values.items() if key in v}
        shown = next((per_ref[r] for r in per_ref if r != condition), fired)
        instances.append(Instance(
            {k: v for k, v in labels.items() if k != "__field__"}, shown,
            "Alerting" if fired == 1.0 else "Normal", per_ref,
        ))
    return instances
