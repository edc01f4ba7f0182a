"""Audit a run: recompute every metric family from the raw events in plain SQL and compare with the stream's views.

The SQL under ``streams/audit_sql`` re-implements trajectory assembly and the window metrics on
``events_raw`` alone (``assembly.sql`` holds the common table expressions, one file per family
selects from them). Nothing of the stream's Python code or derived tables is used to compute the
expected rows (the stream's list of windows only decides which windows also get an all-zero row);
only the final regression test on the recomputed per-version counts reuses
``streams.regression.detect_regressions``. The comparison itself is pure and works on plain rows.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from functools import cache
from pathlib import Path
from typing import Any

from infra.clickhouse.reader import QueryResult
from rollout.errors import ConfigurationError, RolloutError
from streams.regression import RegressionAlert, RegressionConfig, VersionCounts, detect_regressions

SQL_DIR = Path(__file__).with_name("audit_sql")
FLOAT_TOLERANCE = 1e-9

QueryFn = Callable[[str, dict[str, Any]], QueryResult]
"""Runs one read-only statement with bound parameters (e.g. ``infra.clickhouse.reader.query`` on some settings)."""

Row = dict[str, Any]
Key = tuple[tuple[str, Any], ...]


class UnknownRun(ConfigurationError):
    """The run has no raw events; the message lists the runs that do."""

    def __init__(self, run_id: str, known: Sequence[str]) -> None:
        self.run_id = run_id
        self.known = tuple(known)
        listing = ", ".join(self.known) if self.known else "none: events_raw is empty"
        super().__init__(f"unknown run {run_id!r}: no raw events for it (runs with raw events: {listing})")


class InconsistentRead(RolloutError):
    """ClickHouse answered the same filter differently in two phrasings, so no audit result can be trusted."""


class Kind(StrEnum):
    """How a column's values are normalised and compared."""

    TEXT = "text"  # exact
    INT = "int"  # exact, NULL allowed
    FLAG = "flag"  # exact boolean
    FLOAT = "float"  # absolute tolerance FLOAT_TOLERANCE, NULL == NULL
    LIST = "list"  # exact, element by element
    TIME = "time"  # a window start in epoch seconds, shown as ISO time


@dataclass(frozen=True, slots=True)
class Column:
    """One compared column: its name, how to compare it and how to read it from the stream's view."""

    name: str
    kind: Kind = Kind.INT
    stream_sql: str = ""  # expression on the view; the column itself when empty
    empty: Any = 0  # its value in a window without finished trajectories (one-row-per-window families)
    tolerance: float = FLOAT_TOLERANCE  # largest absolute difference of equal floats

    def select(self) -> str:
        """The expression that reads this column from the stream's view."""
        return self.stream_sql or self.name


def _cols(kind: Kind, *names: str) -> tuple[Column, ...]:
    return tuple(Column(name, kind) for name in names)


LAG_FLOATS = ("lag_versions_p50", "lag_versions_p95", "lag_versions_max", "lag_seconds_p50", "lag_seconds_p95",
              "lag_seconds_max")

WINDOW_KEYS = (Column("domain", Kind.TEXT),
               Column("window_start", Kind.TIME, "toInt64(toUnixTimestamp(window_start))"))


@dataclass(frozen=True, slots=True)
class Family:
    """A compared family of rows: the stream's view, the audit's SQL file, key and value columns."""

    name: str
    view: str
    sql_file: str
    keys: tuple[Column, ...]
    values: tuple[Column, ...]
    one_row_per_window: bool = False
    """The stream writes exactly one row per window (zeros when the window holds nothing)."""
    stream_filter: str = ""

    @property
    def columns(self) -> tuple[Column, ...]:
        """Key columns, then value columns."""
        return (*self.keys, *self.values)

    def stream_sql(self) -> str:
        """The read of the stream's rows of one run (``{run:String}``), columns in ``columns`` order."""
        exprs = ",\n       ".join(c.select() for c in self.columns)
        extra = f" AND {self.stream_filter}" if self.stream_filter else ""
        return f"SELECT {exprs}\nFROM {self.view}\nWHERE run_id = {{run:String}}{extra}"

    def empty_row(self, domain: str, window_start: int, weights: Mapping[str, float]) -> Row:
        """The row the stream writes for a window without finished trajectories (one-row families only)."""
        row: Row = {"domain": domain, "window_start": window_start}
        for column in self.values:
            row[column.name] = weights.get(domain, 0.0) if column.name == "configured_weight" else column.empty
        return row


FAMILIES: tuple[Family, ...] = (
    Family("throughput", "v_effective_throughput", "throughput.sql", WINDOW_KEYS,
           _cols(Kind.INT, "finished", "env_valid", "decided", "passed", "undecidable", "digest_mismatches",
                 "model_errors"),
           one_row_per_window=True),
    Family("env_failures", "v_env_failures", "env_failures.sql",
           (*WINDOW_KEYS, *_cols(Kind.TEXT, "origin", "failure_class", "environment_version")),
           _cols(Kind.INT, "failures", "finished")),
    Family("domain_quality", "v_domain_quality", "domain_quality.sql", (*WINDOW_KEYS, Column("policy_version")),
           _cols(Kind.INT, "decided", "passed")),
    Family("policy_lag_finish", "v_policy_lag", "policy_lag_finish.sql", (*WINDOW_KEYS, Column("stage", Kind.TEXT)),
           (Column("trajectories"), *_cols(Kind.FLOAT, *LAG_FLOATS), *_cols(Kind.INT, "over_bound", "staleness_bound")),
           stream_filter="stage = 'finish'"),
    Family("policy_lag_consumption", "v_policy_lag", "policy_lag_consumption.sql",
           (*WINDOW_KEYS, Column("stage", Kind.TEXT)),
           (Column("trajectories"), *_cols(Kind.FLOAT, *LAG_FLOATS), *_cols(Kind.INT, "over_bound", "staleness_bound")),
           stream_filter="stage = 'consumption'"),
    Family("timing", "v_timing", "timing.sql", WINDOW_KEYS,
           (Column("finished"),
            *(Column(name, Kind.FLOAT, empty=None) for name in ("wait_s_p50", "wait_s_p95", "run_s_p50", "run_s_p95")),
            Column("interruptions")),
           one_row_per_window=True),
    Family("interruptions", "v_interruptions", "interruptions.sql", (*WINDOW_KEYS, Column("reason", Kind.TEXT)),
           _cols(Kind.INT, "interruptions")),
    Family("budget", "v_budget", "budget.sql", WINDOW_KEYS,
           (Column("sandbox_seconds", Kind.FLOAT, empty=0.0), Column("effective"),
            Column("configured_weight", Kind.FLOAT)),
           one_row_per_window=True),
    Family("snapshots", "v_snapshots", "snapshots.sql", WINDOW_KEYS,
           _cols(Kind.INT, "snapshots", "snapshot_bytes", "resumes", "resumes_succeeded", "steps_restored",
                 "resumed_trajectories", "resumed_passed"),
           one_row_per_window=True),
    Family("verifier_integrity", "v_verifier_integrity", "verifier_integrity.sql",
           (*WINDOW_KEYS, Column("verifier_version", Kind.TEXT)),
           _cols(Kind.INT, "verdicts", "passed", "failed", "undecidable", "errors", "digest_mismatches",
                 "claimed_complete_failed")),
    Family("undecidable", "v_undecidable", "undecidable.sql", (*WINDOW_KEYS, Column("undecidable_reason", Kind.TEXT)),
           _cols(Kind.INT, "trajectories")),
    Family("environment_versions", "v_environment_versions", "environment_versions.sql",
           (*WINDOW_KEYS, Column("environment_version", Kind.TEXT)), _cols(Kind.INT, "finished", "env_failed")),
)
"""The window metric families, in the order they are reported."""

TRAJECTORIES = Family(
    "trajectories", "v_trajectories", "trajectories.sql", (Column("trajectory_id", Kind.TEXT),),
    (Column("domain", Kind.TEXT), Column("status", Kind.TEXT),
     Column("finished_at_ms", Kind.INT, "toUnixTimestamp64Milli(finished_at)"),
     Column("environment_version", Kind.TEXT), Column("policy_version"), Column("oldest_policy_version"),
     Column("env_failed", Kind.FLAG), Column("failure_class", Kind.TEXT), Column("failure_origin", Kind.TEXT),
     Column("failures"), Column("model_error", Kind.FLAG), Column("verdict", Kind.TEXT),
     Column("verifier_version", Kind.TEXT), Column("artifact_digest", Kind.TEXT),
     Column("digest_match", Kind.FLAG), Column("decided", Kind.FLAG), Column("passed", Kind.FLAG),
     Column("undecidable_reason", Kind.TEXT), Column("claimed_complete", Kind.FLAG), Column("lag_versions"),
     Column("lag_seconds", Kind.FLOAT),
     Column("wait_s", Kind.FLOAT), Column("run_s", Kind.FLOAT), Column("snapshots"), Column("snapshot_bytes"),
     Column("resumes"), Column("resumes_succeeded"), Column("steps_restored"),
     Column("interruption_reasons", Kind.LIST), Column("revision")),
)
"""Per-trajectory records (the view's current record of each trajectory) on the fields the metrics use."""

ALERTS = Family(
    "alerts", "v_alerts", "", (Column("domain", Kind.TEXT), Column("policy_version")),
    (Column("baseline_versions", Kind.LIST), *_cols(Kind.INT, "baseline_decided", "baseline_passed",
                                                     "candidate_decided", "candidate_passed"),
     *_cols(Kind.FLOAT, "drop", "z", "p_value")),
    stream_filter="state = 'firing'",
)
"""Firing regression alerts: the stream's versus those the regression check gives on the SQL-recomputed counts."""

ALL_FAMILIES: tuple[Family, ...] = (*FAMILIES, TRAJECTORIES, ALERTS)


@dataclass(frozen=True, slots=True)
class Difference:
    """One disagreement: a row only one side has, a key one side repeats, or a value that differs."""

    family: str
    key: Key
    kind: str  # missing_in_stream | missing_in_audit | duplicate_in_stream | duplicate_in_audit | value
    column: str = ""
    stream: Any = None
    audit: Any = None

    def key_text(self) -> str:
        """The key as ``name=value`` pairs (window starts as ISO times)."""
        return ", ".join(f"{name}={_show_key(name, value)}" for name, value in self.key)

    def describe(self) -> str:
        """One line saying what differs."""
        if self.kind == "value":
            return f"{self.column}: stream {_show(self.stream)} != audit {_show(self.audit)}"
        return {
            "missing_in_stream": "row only in the audit (the stream has none)",
            "missing_in_audit": "row only in the stream (the raw events give none)",
            "duplicate_in_stream": "key appears more than once in the stream's view",
            "duplicate_in_audit": "key appears more than once in the audit's rows",
        }.get(self.kind, self.kind)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready form."""
        return {"family": self.family, "key": {n: _show_key(n, v) for n, v in self.key}, "kind": self.kind,
                "column": self.column, "stream": self.stream, "audit": self.audit}


@dataclass(frozen=True, slots=True)
class FamilyResult:
    """The comparison of one family: row counts on both sides, keys found on both, the differences."""

    family: str
    view: str
    audit_rows: int
    stream_rows: int
    compared: int
    differences: tuple[Difference, ...]

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (without the differences themselves)."""
        return {"family": self.family, "view": self.view, "audit_rows": self.audit_rows,
                "stream_rows": self.stream_rows, "compared": self.compared, "differences": len(self.differences)}


@dataclass(frozen=True, slots=True)
class AuditReport:
    """Everything an audit of one run found."""

    run_id: str
    window_s: int
    raw_events: int
    families: tuple[FamilyResult, ...] = field(default=())

    @property
    def differences(self) -> list[Difference]:
        """Every difference of every family, in family order."""
        return [d for f in self.families for d in f.differences]

    @property
    def total(self) -> int:
        """How many differences there are."""
        return sum(len(f.differences) for f in self.families)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready form with every difference."""
        return {"run_id": self.run_id, "window_s": self.window_s, "raw_events": self.raw_events,
                "differences": self.total, "families": [f.as_dict() for f in self.families],
                "details": [d.as_dict() for d in self.differences]}


# -- pure comparison ---------------------------------------------------------------------------


def normalise(value: Any, kind: Kind) -> Any:
    """A value in the one form both sides are compared in (ints, floats, bools, strings, lists; None kept)."""
    if value is None:
        return None
    if kind is Kind.FLOAT:
        number = float(value)
        return None if math.isnan(number) else number
    if kind in (Kind.INT, Kind.TIME):
        return int(value)
    if kind is Kind.FLAG:
        if isinstance(value, str):
            return value.strip().lower() in ("1", "true")
        return bool(value)
    if kind is Kind.LIST:
        return [str(v) for v in value]
    return str(value)


def values_equal(stream: Any, audit: Any, kind: Kind, tolerance: float = FLOAT_TOLERANCE) -> bool:
    """Whether two normalised values agree: NULL equals only NULL, floats within ``tolerance``, else exact."""
    if stream is None or audit is None:
        return stream is None and audit is None
    if kind is Kind.FLOAT:
        return bool(abs(float(stream) - float(audit)) <= tolerance)
    return bool(stream == audit)


def normalise_row(family: Family, row: Mapping[str, Any]) -> Row:
    """The row with every compared column normalised (missing columns read as None)."""
    return {c.name: normalise(row.get(c.name), c.kind) for c in family.columns}


def row_key(family: Family, row: Mapping[str, Any]) -> Key:
    """The key of a normalised row."""
    return tuple((c.name, row[c.name]) for c in family.keys)


def compare_family(
    family: Family, audit_rows: Iterable[Mapping[str, Any]], stream_rows: Iterable[Mapping[str, Any]]
) -> FamilyResult:
    """Compare keyed rows: rows missing on either side, repeated keys, and every differing value column."""
    audit = [normalise_row(family, r) for r in audit_rows]
    stream = [normalise_row(family, r) for r in stream_rows]
    differences: list[Difference] = []
    audit_by_key = _index(family, audit, "duplicate_in_audit", differences)
    stream_by_key = _index(family, stream, "duplicate_in_stream", differences)
    compared = 0
    for key in sorted(audit_by_key.keys() | stream_by_key.keys(), key=_sort_key):
        expected = audit_by_key.get(key)
        actual = stream_by_key.get(key)
        if actual is None:
            differences.append(Difference(family.name, key, "missing_in_stream"))
            continue
        if expected is None:
            differences.append(Difference(family.name, key, "missing_in_audit"))
            continue
        compared += 1
        for column in family.values:
            if not values_equal(actual[column.name], expected[column.name], column.kind, column.tolerance):
                differences.append(Difference(family.name, key, "value", column.name, actual[column.name],
                                              expected[column.name]))
    return FamilyResult(family.name, family.view, len(audit), len(stream), compared, tuple(differences))


def _index(family: Family, rows: list[Row], duplicate: str, differences: list[Difference]) -> dict[Key, Row]:
    indexed: dict[Key, Row] = {}
    repeated: Counter[Key] = Counter()
    for row in rows:
        key = row_key(family, row)
        if key in indexed:
            repeated[key] += 1
        else:
            indexed[key] = row
    differences.extend(Difference(family.name, key, duplicate) for key in sorted(repeated, key=_sort_key))
    return indexed


def _sort_key(key: Key) -> tuple[tuple[int, str], ...]:
    return tuple((0, f"{v:020d}") if isinstance(v, int) else (1, str(v)) for _, v in key)


def fill_empty_windows(
    family: Family, audit_rows: Sequence[Mapping[str, Any]], windows: Iterable[tuple[str, int]],
    weights: Mapping[str, float],
) -> list[Row]:
    """Add the zero row of every window the audit has no row for (one-row-per-window families only)."""
    rows = [dict(r) for r in audit_rows]
    if not family.one_row_per_window:
        return rows
    present = {(str(r["domain"]), int(r["window_start"])) for r in rows}
    for domain, start in sorted(set(windows) - present):
        rows.append(family.empty_row(domain, start, weights))
    return rows


def regression_alerts(run_id: str, counts: Iterable[Mapping[str, Any]], config: RegressionConfig
                      ) -> list[RegressionAlert]:
    """The alerts the regression check gives on per-domain, per-version decided/passed counts
    (``version_counts.sql``)."""
    by_domain: dict[str, list[VersionCounts]] = defaultdict(list)
    overall: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for row in counts:
        version, decided, passed = int(row["policy_version"]), int(row["decided"]), int(row["passed"])
        by_domain[str(row["domain"])].append(VersionCounts(version, decided, passed))
        overall[version][0] += decided
        overall[version][1] += passed
    return detect_regressions(run_id, by_domain, [VersionCounts(v, d, p) for v, (d, p) in sorted(overall.items())],
                              config)


def expected_alerts(run_id: str, counts: Iterable[Mapping[str, Any]], config: RegressionConfig) -> list[Row]:
    """The firing alerts the regression check gives on per-domain, per-version decided/passed counts."""
    return [{"domain": a.domain, "policy_version": a.policy_version, "baseline_versions": list(a.baseline_versions),
             "baseline_decided": a.baseline_decided, "baseline_passed": a.baseline_passed,
             "candidate_decided": a.candidate_decided, "candidate_passed": a.candidate_passed, "drop": a.drop,
             "z": a.z, "p_value": a.p_value} for a in regression_alerts(run_id, counts, config)]


# -- the audit ---------------------------------------------------------------------------------


@cache
def audit_file(name: str) -> str:
    """The text of one audit SQL file (``streams/audit_sql/<name>``)."""
    return (SQL_DIR / name).read_text()


def audit_sql(name: str) -> str:
    """The audit statement of one SQL file: the trajectory assembly, then the file's SELECT."""
    return f"{audit_file('assembly.sql')}\n{audit_file(name)}"


RUNS_SQL = "SELECT run_id, count() AS events FROM events_raw GROUP BY run_id ORDER BY run_id"
RUN_EVENTS_SQL = "SELECT count() AS events FROM events_raw WHERE run_id = {run:String}"
STREAM_WINDOWS_SQL = (
    "SELECT DISTINCT domain, toInt64(toUnixTimestamp(window_start)) AS window_start FROM v_windows "
    "WHERE run_id = {run:String}"
)


def audit_params(run_id: str, *, window_s: int, verdict_timeout_s: float, default_staleness_bound: int
                 ) -> dict[str, Any]:
    """The parameters every audit statement is bound with (``assembly.sql`` lists them)."""
    return {
        "run": run_id,
        "window_s": window_s,
        "timeout_s": float(verdict_timeout_s),
        "timeout_us": timedelta(seconds=verdict_timeout_s) // timedelta(microseconds=1),
        "default_bound": default_staleness_bound,
        "tid_from": "",  # every trajectory (assembly.sql)
        "tid_to": "",
    }


def audit_run(
    query_fn: QueryFn,
    run_id: str,
    *,
    window_s: int,
    verdict_timeout_s: float,
    default_staleness_bound: int,
    regression: RegressionConfig | None = None,
) -> AuditReport:
    """Recompute every family of ``run_id`` from its raw events with SQL and compare with the stream's views.

    Raises UnknownRun when the run has no raw events, InconsistentRead when ClickHouse counts the
    run's events differently with and without a filter.
    """
    raw_events = _check_run(query_fn, run_id)
    params = audit_params(run_id, window_s=window_s, verdict_timeout_s=verdict_timeout_s,
                          default_staleness_bound=default_staleness_bound)
    run_only = {"run": run_id}
    windows = {(str(d), int(w)) for d, w in _records(query_fn(audit_sql("windows.sql"), params))}
    windows |= {(str(d), int(w)) for d, w in _records(query_fn(STREAM_WINDOWS_SQL, run_only))}
    weights = {str(d): float(w) for d, w in _records(query_fn(audit_sql("weights.sql"), params))}
    results: list[FamilyResult] = []
    for family in (*FAMILIES, TRAJECTORIES):
        expected = _rows(query_fn(audit_sql(family.sql_file), params))
        expected = fill_empty_windows(family, expected, windows, weights)
        actual = _positional_rows(family, query_fn(family.stream_sql(), run_only))
        results.append(compare_family(family, expected, actual))
    counts = _rows(query_fn(audit_sql("version_counts.sql"), params))
    alerts = expected_alerts(run_id, counts, regression or RegressionConfig())
    actual_alerts = _positional_rows(ALERTS, query_fn(ALERTS.stream_sql(), run_only))
    results.append(compare_family(ALERTS, alerts, actual_alerts))
    _check_run(query_fn, run_id)  # a read that went wrong during the audit shows here too
    return AuditReport(run_id, window_s, raw_events, tuple(results))


def _check_run(query_fn: QueryFn, run_id: str) -> int:
    per_run = {str(run): int(n) for run, n in _records(query_fn(RUNS_SQL, {}))}
    if per_run.get(run_id, 0) == 0:
        raise UnknownRun(run_id, sorted(per_run))
    filtered = int(query_fn(RUN_EVENTS_SQL, {"run": run_id}).rows[0][0])
    if filtered != per_run[run_id]:
        raise InconsistentRead(
            f"ClickHouse counts {per_run[run_id]} raw events of run {run_id!r} when grouping the whole table but "
            f"{filtered} when filtering by run: its reads are not consistent (a stale query condition cache has "
            "been seen to do this); restart the process that owns ClickHouse and audit again"
        )
    return per_run[run_id]


def _records(result: QueryResult) -> list[list[Any]]:
    return [list(r) for r in result.rows]


def _rows(result: QueryResult) -> list[Row]:
    return [dict(zip(result.columns, r, strict=True)) for r in result.rows]


def _positional_rows(family: Family, result: QueryResult) -> list[Row]:
    names = [c.name for c in family.columns]
    return [dict(zip(names, r, strict=True)) for r in result.rows]


def _show_key(name: str, value: Any) -> str:
    if name == "window_start" and isinstance(value, int):
        return datetime.fromtimestamp(value, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return str(value)


def _show(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return repr(value)
    return str(value)
