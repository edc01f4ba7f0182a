"""Rows of the results table, their targets, and the table as Markdown or plain text (pure functions)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

GIB = 1024**3
MIB = 1024**2


@dataclass(frozen=True, slots=True)
class Target:
    """One condition a row must meet.

    ``kind``: ``at_least`` / ``at_most`` (the value against ``threshold``), ``ratio_at_least`` (value
    / baseline against ``threshold``), ``holds`` (the row's check named ``check`` is true).
    """

    kind: str
    threshold: float = 0.0
    check: str = ""

    def met(self, row: Row) -> bool | None:
        """True or False, or None when the row lacks what the condition needs."""
        if self.kind == "holds":
            return row.checks.get(self.check)
        if row.value is None or math.isnan(row.value):
            return None
        if self.kind == "at_least":
            return row.value >= self.threshold
        if self.kind == "at_most":
            return row.value <= self.threshold
        if self.kind == "ratio_at_least":
            ratio = row.ratio
            return None if ratio is None else ratio >= self.threshold
        raise ValueError(f"unknown target kind {self.kind!r}")

    def describe(self, unit: str) -> str:
        """The condition as the table shows it."""
        if self.kind == "at_least":
            return f">= {format_value(self.threshold, unit)}"
        if self.kind == "at_most":
            return f"<= {format_value(self.threshold, unit)}"
        if self.kind == "ratio_at_least":
            return f">= {self.threshold:g}x baseline"
        return self.check


@dataclass
class Row:
    """One line of the results table."""

    name: str
    unit: str
    value: float | None
    baseline: float | None = None
    baseline_label: str = ""
    targets: tuple[Target, ...] = ()
    checks: dict[str, bool] = field(default_factory=dict)
    note: str = ""
    scaled: bool = False
    """Measured at a smaller size than the target names: a ``yes`` holds for that size only."""
    paired_ratio: float | None = None
    """For runs that took turns with their baseline's: the median of the pairs' ratios (bench.measure.paired_ratio),
    which ``ratio`` then reports instead of value / baseline (the two sides' medians may come from different pairs)."""

    @property
    def ratio(self) -> float | None:
        """The paired ratio if any, else value / baseline when both are known and the baseline is not zero."""
        if self.paired_ratio is not None:
            return self.paired_ratio
        if self.value is None or self.baseline is None or self.baseline == 0:
            return None
        if math.isinf(self.value):
            return math.inf
        return self.value / self.baseline

    @property
    def met(self) -> bool | None:
        """All targets met (True), any missed (False), or None when there are none or one is unknown."""
        if not self.targets:
            return None
        outcomes = [t.met(self) for t in self.targets]
        if any(o is False for o in outcomes):
            return False
        if any(o is None for o in outcomes):
            return None
        return True


def format_value(value: float | None, unit: str) -> str:
    """A number with its unit, rounded for reading (``-`` when unknown, ``never`` for infinite latency)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if math.isinf(value):
        return "never (censored)" if unit in ("s", "ms") else "inf"
    if unit == "events/s":
        return f"{value:,.0f} events/s"
    if unit == "s":
        return f"{value:.2f} s" if value < 10 else f"{value:,.0f} s"
    if unit == "ms":
        return f"{value:,.0f} ms" if value >= 10 else f"{value:.1f} ms"
    if unit == "bytes":
        return f"{value / GIB:.2f} GiB" if value >= GIB else f"{value / MIB:.0f} MiB"
    return f"{value:g} {unit}".strip()


def format_ratio(ratio: float | None) -> str:
    """``0.42x`` or ``-``."""
    if ratio is None:
        return "-"
    if math.isinf(ratio):
        return "inf"
    return f"{ratio:.2f}x"


def format_met(met: bool | None, scaled: bool = False) -> str:
    """``yes`` (``yes*`` when measured at a scaled-down size), ``NO`` or ``-``."""
    if met is None:
        return "-"
    if not met:
        return "NO"
    return "yes*" if scaled else "yes"


HEADERS = ("benchmark", "value", "baseline", "ratio", "target", "met?", "notes")


def table_cells(rows: Sequence[Row]) -> list[list[str]]:
    """The results table's cells, one list per row, in HEADERS order."""
    cells = []
    for row in rows:
        baseline = format_value(row.baseline, row.unit) if row.baseline is not None else "-"
        if row.baseline is not None and row.baseline_label:
            baseline = f"{baseline} ({row.baseline_label})"
        target = ", ".join(t.describe(row.unit) for t in row.targets) or "-"
        cells.append([row.name, format_value(row.value, row.unit), baseline, format_ratio(row.ratio), target,
                      format_met(row.met, row.scaled), row.note])
    return cells


def markdown_table(headers: Sequence[str], cells: Sequence[Sequence[str]]) -> str:
    """A GitHub Markdown table; ``|`` inside cells is escaped."""
    def line(values: Sequence[str]) -> str:
        return "| " + " | ".join(v.replace("|", "\\|").replace("\n", " ") for v in values) + " |"

    out = [line(headers), "| " + " | ".join("---" for _ in headers) + " |"]
    out.extend(line(row) for row in cells)
    return "\n".join(out)


def text_table(headers: Sequence[str], cells: Sequence[Sequence[str]], *, max_width: int = 48) -> str:
    """A plain-text table with aligned columns; cells longer than ``max_width`` are cut with ``...``."""
    def cut(value: str) -> str:
        return value if len(value) <= max_width else value[: max_width - 3] + "..."

    rows = [[cut(v) for v in headers], *[[cut(v) for v in row] for row in cells]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(headers))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
