"""Expand panel and alert queries exactly as Grafana and the ClickHouse plugin (>= 4.19) do.

Two steps, in Grafana's order:

1. **Template variables** (the browser, dashboards only): ``$__conditionalAll(cond, $var)`` first,
   then ``${var:format}``, ``${var}`` and ``$var``. Alert rules skip this step.
2. **Backend macros** (the plugin's Go code, dashboards and alert rules): SQL comments are blanked,
   then ``$__name`` and ``$__name(args)`` are replaced; arguments split on top-level commas only;
   ``(`` must follow the name directly; an unknown ``$__x`` is left as it is.

The expansions are the plugin's, character for character, so the expanded text can be run on
ClickHouse to check a dashboard without a Grafana server.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from dashboards.exceptions import MacroError

__all__ = [
    "ALL",
    "TimeRange",
    "Variable",
    "blank_comments",
    "expand_alert_query",
    "expand_macros",
    "expand_panel_query",
    "interpolate_variables",
    "panel_interval_ms",
    "parse_duration_ms",
    "round_interval_ms",
    "split_arguments",
]

ALL = "$__all"
"""The value Grafana stores for a variable set to "All"."""

_IDENT = re.compile(r"[A-Za-z0-9_]+")


@dataclass(frozen=True, slots=True)
class TimeRange:
    """The dashboard's (or the rule's) time range, as UTC instants."""

    start: datetime
    end: datetime

    def __post_init__(self) -> None:
        if self.start.tzinfo is None or self.end.tzinfo is None:
            raise MacroError("time range bounds must be timezone-aware")
        if self.end < self.start:
            raise MacroError("time range ends before it starts")

    @property
    def milliseconds(self) -> int:
        """Length of the range in milliseconds."""
        return round((self.end - self.start).total_seconds() * 1000)


@dataclass(frozen=True, slots=True)
class Variable:
    """A dashboard variable's current state, as the browser holds it when a panel is queried.

    ``values`` are the selected values; ``ALL`` among them (or ``all_selected``) means "All",
    which Grafana expands to every option in ``options`` (or ``all_value`` when one is set).
    ``multi`` marks a multi-value or include-All variable (it changes the default format).
    """

    values: tuple[str, ...]
    multi: bool = False
    options: tuple[str, ...] = ()
    all_value: str | None = None
    all_selected: bool = field(default=False)

    @classmethod
    def single(cls, value: str) -> Variable:
        """A single-value variable."""
        return cls(values=(value,))

    @classmethod
    def many(cls, values: Sequence[str], options: Sequence[str] = ()) -> Variable:
        """A multi-value variable with some values selected."""
        return cls(values=tuple(values), multi=True, options=tuple(options))

    @classmethod
    def all(cls, options: Sequence[str], all_value: str | None = None) -> Variable:
        """A multi-value variable set to All, whose options are ``options``."""
        return cls(values=(ALL,), multi=True, options=tuple(options), all_value=all_value, all_selected=True)

    @property
    def is_all(self) -> bool:
        """True when the variable is set to All."""
        return self.all_selected or ALL in self.values

    @property
    def effective_values(self) -> tuple[str, ...]:
        """What the variable stands for: its values, or every option when it is All."""
        return self.options if self.is_all else self.values


# -- template variables (frontend) ---------------------------------------------------------------

_VARIABLE = re.compile(
    r"\$\{(?P<braced>[A-Za-z0-9_]+)(?::(?P<format>[A-Za-z0-9_]+))?\}"
    r"|\$(?P<plain>[A-Za-z0-9_]+)"
)


def _quote_join(values: Sequence[str], quote: str, escape: str | None) -> str:
    out = []
    for value in values:
        text = value.replace(quote, escape + quote) if escape is not None else value
        out.append(f"{quote}{text}{quote}")
    return ",".join(out)


def _format_value(variable: Variable, fmt: str | None) -> str:
    """One variable in one format, as Grafana's template service formats it."""
    if variable.is_all and variable.all_value is not None:
        return variable.all_value
    values = variable.effective_values
    if fmt is None:
        if variable.multi or variable.is_all:
            # The SQL data sources' default for multi-value variables: quoted, nothing escaped.
            return _quote_join(values, "'", None)
        return values[0] if values else ""
    if fmt == "singlequote":
        return _quote_join(values, "'", "\\")
    if fmt == "doublequote":
        return _quote_join(values, '"', "\\")
    if fmt == "sqlstring":
        return _quote_join(values, "'", "'")
    if fmt in ("csv", "raw", "text"):
        return ",".join(values)
    if fmt == "pipe":
        return "|".join(values)
    raise MacroError(f"variable format {fmt!r} is not supported by this expander")


def _conditional_all(sql: str, variables: Mapping[str, Variable]) -> str:
    """Replace every ``$__conditionalAll(cond, $var)`` by ``1=1`` (All or empty) or by ``cond``."""
    name = "$__conditionalAll"
    out: list[str] = []
    i = 0
    while True:
        at = sql.find(name, i)
        if at < 0:
            out.append(sql[i:])
            return "".join(out)
        after = at + len(name)
        if after < len(sql) and (sql[after].isalnum() or sql[after] == "_"):
            out.append(sql[i:after])
            i = after
            continue
        if after >= len(sql) or sql[after] != "(":
            raise MacroError("$__conditionalAll needs (condition, $variable)")
        args, end = _arguments(sql, after)
        if len(args) != 2:
            raise MacroError(f"$__conditionalAll takes 2 arguments, got {len(args)}: {args!r}")
        condition, ref = args
        match = re.fullmatch(r"\$\{?([A-Za-z0-9_]+)(?::[A-Za-z0-9_]+)?\}?", ref.strip())
        if match is None:
            raise MacroError(f"$__conditionalAll's second argument must be a variable, got {ref!r}")
        variable = variables.get(match.group(1))
        if variable is None:
            raise MacroError(f"$__conditionalAll refers to unknown variable {match.group(1)!r}")
        empty = not variable.values or all(v == "" for v in variable.values)
        out.append(sql[i:at])
        # The plugin replaces the innermost occurrence first: expand any nested one in the condition.
        out.append("1=1" if variable.is_all or empty else _conditional_all(condition, variables))
        i = end


def interpolate_variables(sql: str, variables: Mapping[str, Variable]) -> str:
    """Apply the browser's step: ``$__conditionalAll`` and template variables; unknown names stay."""
    sql = _conditional_all(sql, variables)

    def replace(match: re.Match[str]) -> str:
        name = match.group("braced") or match.group("plain")
        variable = variables.get(name)
        if variable is None:
            return match.group(0)
        return _format_value(variable, match.group("format"))

    return _VARIABLE.sub(replace, sql)


# -- backend macros ------------------------------------------------------------------------------


def blank_comments(sql: str) -> str:
    """Replace ``-- …`` and ``/* … */`` comments by spaces (newlines kept); quoted text is untouched."""
    chars = list(sql)
    i, n = 0, len(sql)
    while i < n:
        ch = sql[i]
        if ch in "'\"`":
            j = i + 1
            while j < n and sql[j] != ch:
                j += 2 if sql[j] == "\\" else 1
            i = j + 1
        elif sql.startswith("--", i):
            j = sql.find("\n", i)
            j = n if j < 0 else j
            for k in range(i, j):
                chars[k] = " "
            i = j
        elif sql.startswith("/*", i):
            j = sql.find("*/", i + 2)
            j = n if j < 0 else j + 2
            for k in range(i, j):
                if chars[k] != "\n":
                    chars[k] = " "
            i = j
        else:
            i += 1
    return "".join(chars)


def split_arguments(text: str) -> list[str]:
    """Split macro arguments on commas outside parentheses and quotes; each is stripped."""
    args: list[str] = []
    depth = 0
    start = 0
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in "'\"`":
            j = i + 1
            while j < n and text[j] != ch:
                j += 2 if text[j] == "\\" else 1
            i = j + 1
            continue
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "," and depth == 0:
            args.append(text[start:i].strip())
            start = i + 1
        i += 1
    last = text[start:].strip()
    if args or last:
        args.append(last)
    return args


def _arguments(sql: str, open_at: int) -> tuple[list[str], int]:
    """The arguments of the call whose ``(`` is at ``open_at``, and the index after its ``)``."""
    depth = 0
    i, n = open_at, len(sql)
    while i < n:
        ch = sql[i]
        if ch in "'\"`":
            j = i + 1
            while j < n and sql[j] != ch:
                j += 2 if sql[j] == "\\" else 1
            i = j + 1
            continue
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return split_arguments(sql[open_at + 1:i]), i + 1
        i += 1
    raise MacroError(f"unbalanced parentheses after {sql[max(0, open_at - 20):open_at]!r}")


def _seconds(t: datetime) -> int:
    return math.floor(t.timestamp())


def _millis(t: datetime) -> int:
    return math.floor(t.timestamp() * 1000)


def _d(t: datetime) -> str:
    return f"toDateTime({_seconds(t)})"


def _m(t: datetime) -> str:
    return f"fromUnixTimestamp64Milli({_millis(t)})"


def _dd(t: datetime) -> str:
    return f"toDate('{t.astimezone(UTC):%Y-%m-%d}')"


_DURATION = re.compile(r"^(?P<n>\d+(?:\.\d+)?)(?P<unit>ms|s|m|h|d|w|y)?$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000,
            "y": 31_536_000_000}


def parse_duration_ms(text: str) -> int:
    """A Grafana duration (``30s``, ``5m``, ``1h``, ``500ms``; a bare number is seconds) in milliseconds."""
    match = _DURATION.match(text.strip().strip("'\""))
    if match is None:
        raise MacroError(f"not a duration: {text!r} (use e.g. 30s, 5m, 1h)")
    return round(float(match.group("n")) * _UNIT_MS[match.group("unit") or "s"])


@dataclass(frozen=True, slots=True)
class _Context:
    time_range: TimeRange
    interval_ms: int

    @property
    def seconds(self) -> int:
        return max(self.interval_ms // 1000, 1)

    @property
    def millis(self) -> int:
        return max(self.interval_ms, 1)


def _need(name: str, args: list[str], count: int) -> list[str]:
    if len(args) != count:
        raise MacroError(f"{name} takes {count} argument(s), got {len(args)}: {args!r}")
    return args


def _time_filter(args: list[str], c: _Context) -> str:
    (col,) = _need("$__timeFilter", args, 1)
    return f"{col} >= {_d(c.time_range.start)} AND {col} <= {_d(c.time_range.end)}"


def _time_filter_ms(args: list[str], c: _Context) -> str:
    (col,) = _need("$__timeFilter_ms", args, 1)
    return f"{col} >= {_m(c.time_range.start)} AND {col} <= {_m(c.time_range.end)}"


def _date_filter(args: list[str], c: _Context) -> str:
    (col,) = _need("$__dateFilter", args, 1)
    return f"{col} >= {_dd(c.time_range.start)} AND {col} <= {_dd(c.time_range.end)}"


def _date_time_filter(args: list[str], c: _Context) -> str:
    date_col, time_col = _need("$__dateTimeFilter", args, 2)
    r = c.time_range
    return (f"({date_col} >= {_dd(r.start)} AND {date_col} <= {_dd(r.end)}) AND "
            f"({time_col} >= {_d(r.start)} AND {time_col} <= {_d(r.end)})")


def _time_interval(args: list[str], c: _Context) -> str:
    (col,) = _need("$__timeInterval", args, 1)
    return f"toStartOfInterval(toDateTime({col}), INTERVAL {c.seconds} second)"


def _time_interval_ms(args: list[str], c: _Context) -> str:
    (col,) = _need("$__timeInterval_ms", args, 1)
    return f"toStartOfInterval(toDateTime64({col}, 3), INTERVAL {c.millis} millisecond)"


def _time_group(args: list[str], c: _Context) -> str:
    col, size = _need("$__timeGroup", args, 2)
    seconds = max(parse_duration_ms(size) // 1000, 1)
    return f"toStartOfInterval(toDateTime({col}), INTERVAL {seconds} second)"


def _time_from(args: list[str], c: _Context) -> str:
    (col,) = _need("$__timeFrom", args, 1)
    return f"{col} >= {_d(c.time_range.start)}"


def _time_to(args: list[str], c: _Context) -> str:
    (col,) = _need("$__timeTo", args, 1)
    return f"{col} <= {_d(c.time_range.end)}"


_WITH_ARGS: dict[str, Callable[[list[str], _Context], str]] = {
    "timeFilter": _time_filter,
    "timeFilter_ms": _time_filter_ms,
    "dateFilter": _date_filter,
    "dateTimeFilter": _date_time_filter,
    "dt": _date_time_filter,
    "timeInterval": _time_interval,
    "timeInterval_ms": _time_interval_ms,
    "timeGroup": _time_group,
    "timeFrom": _time_from,
    "timeTo": _time_to,
}

_WITHOUT_ARGS: dict[str, Callable[[_Context], str]] = {
    "fromTime": lambda c: _d(c.time_range.start),
    "toTime": lambda c: _d(c.time_range.end),
    "fromTime_ms": lambda c: _m(c.time_range.start),
    "toTime_ms": lambda c: _m(c.time_range.end),
    "interval_s": lambda c: str(c.seconds),
}


def expand_macros(sql: str, *, time_range: TimeRange, interval_ms: int) -> str:
    """Apply the plugin's backend step: blank comments, then replace every known ``$__`` macro."""
    context = _Context(time_range, interval_ms)
    sql = blank_comments(sql)
    out: list[str] = []
    i = 0
    n = len(sql)
    while True:
        at = sql.find("$__", i)
        if at < 0:
            out.append(sql[i:])
            return "".join(out)
        match = _IDENT.match(sql, at + 3)
        if match is None:
            out.append(sql[i:at + 3])
            i = at + 3
            continue
        name, end = match.group(0), match.end()
        out.append(sql[i:at])
        if name in _WITH_ARGS:
            if end >= n or sql[end] != "(":
                raise MacroError(f"$__{name} needs its arguments in parentheses right after the name")
            args, after = _arguments(sql, end)
            out.append(_WITH_ARGS[name](args, context))
            i = after
        elif name in _WITHOUT_ARGS:
            out.append(_WITHOUT_ARGS[name](context))
            i = end
            if sql.startswith("()", end):
                i = end + 2
        else:
            out.append(sql[at:end])  # unknown macro: left as is
            i = end


# -- intervals -----------------------------------------------------------------------------------

_ROUND_STEPS_MS: tuple[tuple[int, int], ...] = (
    (15, 10), (35, 20), (75, 50), (150, 100), (350, 200), (750, 500), (1_500, 1_000), (3_500, 2_000),
    (7_500, 5_000), (12_500, 10_000), (17_500, 15_000), (25_000, 20_000), (45_000, 30_000),
    (90_000, 60_000), (210_000, 120_000), (450_000, 300_000), (750_000, 600_000), (1_050_000, 900_000),
    (1_500_000, 1_200_000), (2_700_000, 1_800_000), (5_400_000, 3_600_000), (9_000_000, 7_200_000),
    (16_200_000, 10_800_000), (32_400_000, 21_600_000), (86_400_000, 43_200_000),
    (604_800_000, 86_400_000), (1_814_400_000, 604_800_000), (3_628_800_000, 2_592_000_000),
)


def round_interval_ms(interval_ms: float) -> int:
    """Grafana's ``roundInterval``: the "nice" interval for a raw range / max data points."""
    for below, value in _ROUND_STEPS_MS:
        if interval_ms < below:
            return value
    return 31_536_000_000


def panel_interval_ms(time_range: TimeRange, *, max_data_points: int, min_interval: str | None) -> int:
    """The ``$__interval`` Grafana gives a panel: range / max data points, rounded, at least the minimum."""
    raw = time_range.milliseconds / max(max_data_points, 1)
    interval = round_interval_ms(raw)
    if min_interval:
        interval = max(interval, parse_duration_ms(min_interval))
    return interval


# -- the two entry points ------------------------------------------------------------------------


def expand_panel_query(sql: str, *, time_range: TimeRange, interval_ms: int,
                       variables: Mapping[str, Variable]) -> str:
    """A dashboard panel's query as ClickHouse receives it: variables first, then backend macros."""
    return expand_macros(interpolate_variables(sql, variables), time_range=time_range, interval_ms=interval_ms)


def expand_alert_query(sql: str, *, now: datetime, relative_from_s: int, relative_to_s: int = 0,
                       interval_ms: int = 1000) -> str:
    """An alert rule's query as ClickHouse receives it at ``now``: backend macros only.

    The range is ``[now - from, now - to]`` (the query's relativeTimeRange) and the interval is
    the model's ``intervalMs`` (Grafana's default is 1000 ms when the model has none).
    """
    time_range = TimeRange(now - timedelta(seconds=relative_from_s), now - timedelta(seconds=relative_to_s))
    return expand_macros(sql, time_range=time_range, interval_ms=interval_ms)
