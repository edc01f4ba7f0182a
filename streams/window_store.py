"""Metric windows in ClickHouse: one row of ``m_window_metrics`` per run × domain × window, every family in it.

A window's families (``metrics.window_rows`` and ``metrics.breakdown_rows``) become one wide row:
the families with one row per window as plain columns, the others as Nested columns (parallel
arrays, one element per family row). Every recompute writes the window's whole row with a new
version, and a batch's windows go in with one INSERT; the ``v_*`` views read the newest row of each
window (``ReplacingMergeTree(version)`` with ``FINAL``). A row is all of a window's families at one
version, so a reader never sees a window half rewritten, and a class or policy version that left the
window is gone from the new row.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from streams.metrics import Row, WindowKey

TABLE = "m_window_metrics"
KEY_COLUMNS = ("run_id", "domain", "window_start", "window_end")


@dataclass(frozen=True, slots=True)
class Single:
    """A family with exactly one row per window: each field is a column (renamed where two families share a name)."""

    family: str
    fields: tuple[str, ...]
    renamed: tuple[tuple[str, str], ...] = ()

    def columns(self) -> list[str]:
        """The table columns of this family, in field order."""
        names = dict(self.renamed)
        return [names.get(f, f) for f in self.fields]


@dataclass(frozen=True, slots=True)
class Multi:
    """A family with any number of rows per window: a Nested column, one array per field."""

    family: str
    nested: str
    fields: tuple[str, ...]

    def columns(self) -> list[str]:
        """The table columns (``nested.field``) of this family, in field order."""
        return [f"{self.nested}.{f}" for f in self.fields]


FAMILIES: tuple[Single | Multi, ...] = (
    Single("m_throughput", ("finished", "env_valid", "decided", "passed", "undecidable", "digest_mismatches",
                            "model_errors")),
    Single("m_timing", ("finished", "wait_s_p50", "wait_s_p95", "run_s_p50", "run_s_p95", "interruptions"),
           renamed=(("finished", "timing_finished"),)),
    Single("m_budget", ("sandbox_seconds", "effective", "configured_weight")),
    Single("m_snapshots", ("snapshots", "snapshot_bytes", "resumes", "resumes_succeeded", "steps_restored",
                           "resumed_trajectories", "resumed_passed")),
    Multi("m_env_failures", "env_failures", ("origin", "failure_class", "environment_version", "failures",
                                             "finished")),
    Multi("m_domain_quality", "quality", ("policy_version", "decided", "passed")),
    Multi("m_policy_lag", "policy_lag", ("stage", "trajectories", "lag_versions_p50", "lag_versions_p95",
                                         "lag_versions_max", "lag_seconds_p50", "lag_seconds_p95", "lag_seconds_max",
                                         "over_bound", "staleness_bound")),
    Multi("m_interruptions", "interruptions_by_reason", ("reason", "interruptions")),
    Multi("m_verifier_integrity", "verifier_integrity", ("verifier_version", "verdicts", "passed", "failed",
                                                         "undecidable", "errors", "digest_mismatches",
                                                         "claimed_complete_failed")),
    Multi("m_undecidable", "undecidable_reasons", ("undecidable_reason", "trajectories")),
    Multi("m_environment_versions", "environment_versions", ("environment_version", "finished", "env_failed")),
)
"""Every family of a window and where its fields are stored."""

COLUMNS: tuple[str, ...] = (*KEY_COLUMNS, *(c for f in FAMILIES for c in f.columns()), "version")
"""The columns of ``m_window_metrics`` the worker writes, in the order of ``window_row``."""


class WindowShapeError(ValueError):
    """The family rows of a window do not fit the table: a family missing or unknown, a field missing or extra."""


def window_row(key: WindowKey, window_end: datetime, version: int, families: Mapping[str, Sequence[Row]]
               ) -> list[Any]:
    """The table row of one window at ``version``, values in ``COLUMNS`` order.

    ``families`` maps every family name of ``FAMILIES`` to its rows for this window (each carrying the
    window's key columns, which are checked, and the family's fields).
    """
    unknown = set(families) - {f.family for f in FAMILIES}
    if unknown:
        raise WindowShapeError(f"families the table has no columns for: {sorted(unknown)}")
    values: list[Any] = [key.run_id, key.domain, key.window_start, window_end]
    expected = dict(zip(KEY_COLUMNS, values, strict=True))
    for family in FAMILIES:
        if family.family not in families:
            raise WindowShapeError(f"{key}: family {family.family} missing")
        rows = families[family.family]
        for row in rows:
            _check_row(family, row, expected)
        if isinstance(family, Single):
            if len(rows) != 1:
                raise WindowShapeError(f"{key}: family {family.family} has {len(rows)} rows, not 1")
            values.extend(rows[0][f] for f in family.fields)
        else:
            values.extend([row[f] for row in rows] for f in family.fields)
    values.append(version)
    return values


def _check_row(family: Single | Multi, row: Row, key: Mapping[str, Any]) -> None:
    fields = set(row) - set(KEY_COLUMNS)
    if fields != set(family.fields):
        raise WindowShapeError(f"family {family.family}: fields {sorted(fields)} != {sorted(family.fields)}")
    for name, value in key.items():
        if row.get(name) != value:
            raise WindowShapeError(f"family {family.family}: {name} {row.get(name)!r} is not the window's {value!r}")


def write_windows(client: Any, database: str, rows: Sequence[list[Any]]) -> None:
    """Insert the rows of ``window_row`` with one INSERT (nothing when there are none)."""
    if rows:
        client.insert(TABLE, list(rows), column_names=list(COLUMNS), database=database)


def stored_windows(client: Any, database: str, run_id: str) -> set[WindowKey]:
    """Every window of the run that has a row."""
    result = client.query(
        f"SELECT DISTINCT domain, window_start FROM {database}.{TABLE} WHERE run_id = {{run:String}}",
        parameters={"run": run_id},
    )
    return {WindowKey(run_id, str(domain), _utc(start)) for domain, start in result.result_rows}


def family_rows(row: Mapping[str, Any]) -> dict[str, list[Row]]:
    """The family rows stored in one table row (by column name): the inverse of ``window_row``."""
    base = {name: row[name] for name in KEY_COLUMNS}
    families: dict[str, list[Row]] = {}
    for family in FAMILIES:
        columns = family.columns()
        if isinstance(family, Single):
            families[family.family] = [{**base, **{f: row[c] for f, c in zip(family.fields, columns, strict=True)}}]
        else:
            arrays: Iterable[Sequence[Any]] = [row[c] for c in columns]
            families[family.family] = [{**base, **dict(zip(family.fields, items, strict=True))}
                                       for items in zip(*arrays, strict=True)]
    return families


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
