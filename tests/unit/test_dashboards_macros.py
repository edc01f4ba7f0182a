"""The query expander gives exactly the ClickHouse plugin's expansions (the reference table) and Grafana's variables."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dashboards.exceptions import MacroError
from dashboards.macros import (
    TimeRange,
    Variable,
    blank_comments,
    expand_alert_query,
    expand_macros,
    expand_panel_query,
    interpolate_variables,
    panel_interval_ms,
    parse_duration_ms,
    round_interval_ms,
    split_arguments,
)

# from = 2026-01-01 00:00:00.750 UTC, to = 2026-01-02 06:30:15.250 UTC: sub-second parts test flooring.
FROM = datetime(2026, 1, 1, 0, 0, 0, 750_000, tzinfo=UTC)
TO = datetime(2026, 1, 2, 6, 30, 15, 250_000, tzinfo=UTC)
RANGE = TimeRange(FROM, TO)
D_FROM, D_TO = "toDateTime(1767225600)", "toDateTime(1767335415)"
M_FROM, M_TO = "fromUnixTimestamp64Milli(1767225600750)", "fromUnixTimestamp64Milli(1767335415250)"
DD_FROM, DD_TO = "toDate('2026-01-01')", "toDate('2026-01-02')"


def expand(sql: str, interval_ms: int = 90_500) -> str:
    return expand_macros(sql, time_range=RANGE, interval_ms=interval_ms)


@pytest.mark.parametrize(("macro", "expected"), [
    ("$__timeFilter(c)", f"c >= {D_FROM} AND c <= {D_TO}"),
    ("$__timeFilter_ms(c)", f"c >= {M_FROM} AND c <= {M_TO}"),
    ("$__dateFilter(d)", f"d >= {DD_FROM} AND d <= {DD_TO}"),
    ("$__dateTimeFilter(d, t)", f"(d >= {DD_FROM} AND d <= {DD_TO}) AND (t >= {D_FROM} AND t <= {D_TO})"),
    ("$__dt(d, t)", f"(d >= {DD_FROM} AND d <= {DD_TO}) AND (t >= {D_FROM} AND t <= {D_TO})"),
    ("$__fromTime", D_FROM),
    ("$__toTime", D_TO),
    ("$__fromTime_ms", M_FROM),
    ("$__toTime_ms", M_TO),
    ("$__timeInterval(c)", "toStartOfInterval(toDateTime(c), INTERVAL 90 second)"),
    ("$__timeInterval_ms(c)", "toStartOfInterval(toDateTime64(c, 3), INTERVAL 90500 millisecond)"),
    ("$__interval_s", "90"),
    ("$__timeFrom(c)", f"c >= {D_FROM}"),
    ("$__timeTo(c)", f"c <= {D_TO}"),
    ("$__timeGroup(c, 5m)", "toStartOfInterval(toDateTime(c), INTERVAL 300 second)"),
    ("$__timeGroup(c, '1h')", "toStartOfInterval(toDateTime(c), INTERVAL 3600 second)"),
])
def test_each_macro_expands_as_the_reference_table_says(macro: str, expected: str) -> None:
    assert expand(macro) == expected
    assert expand(f"SELECT 1 WHERE {macro} LIMIT 1") == f"SELECT 1 WHERE {expected} LIMIT 1"


def test_interval_below_a_second_counts_as_one_second_and_one_millisecond_at_least() -> None:
    assert expand("$__interval_s", interval_ms=400) == "1"
    assert expand("$__timeInterval(c)", interval_ms=400) == "toStartOfInterval(toDateTime(c), INTERVAL 1 second)"
    assert expand("$__timeInterval_ms(c)", interval_ms=0) == (
        "toStartOfInterval(toDateTime64(c, 3), INTERVAL 1 millisecond)"
    )


def test_arguments_split_on_top_level_commas_only() -> None:
    assert split_arguments("toDate(x, 'UTC'), y") == ["toDate(x, 'UTC')", "y"]
    assert split_arguments("a, 'b,c', f(d, e)") == ["a", "'b,c'", "f(d, e)"]
    assert split_arguments("") == []
    assert expand("$__timeFilter(toDateTime(ts, 'UTC'))") == (
        f"toDateTime(ts, 'UTC') >= {D_FROM} AND toDateTime(ts, 'UTC') <= {D_TO}"
    )
    assert expand("$__dt(toDate(ts, 'UTC'), toDateTime(ts, 'UTC'))").startswith(
        f"(toDate(ts, 'UTC') >= {DD_FROM} AND toDate(ts, 'UTC') <= {DD_TO}) AND (toDateTime(ts, 'UTC') >= "
    )


def test_comments_are_blanked_before_macros_are_found() -> None:
    sql = "SELECT 1 -- $__timeFilter(a)\nWHERE /* $__fromTime */ $__timeFilter(b)"
    expanded = expand(sql)
    assert "$__" not in expanded and "--" not in expanded and "/*" not in expanded
    assert expanded.endswith(f"b >= {D_FROM} AND b <= {D_TO}")
    assert expanded.count("\n") == 1
    assert blank_comments("SELECT '-- not a comment' -- gone") == "SELECT '-- not a comment'        "


def test_unknown_macros_are_left_as_they_are() -> None:
    assert expand("SELECT $__foo(bar), $__interval_ms, $__") == "SELECT $__foo(bar), $__interval_ms, $__"


def test_a_macro_needs_its_parenthesis_right_after_the_name() -> None:
    with pytest.raises(MacroError, match="right after the name"):
        expand("WHERE $__timeFilter (c)")
    with pytest.raises(MacroError, match="takes 1 argument"):
        expand("WHERE $__timeFilter(a, b)")
    with pytest.raises(MacroError, match="unbalanced"):
        expand("WHERE $__timeFilter(a")


def test_the_alert_step_uses_the_rules_relative_range_and_interval() -> None:
    now = datetime(2026, 1, 1, 2, 0, tzinfo=UTC)
    sql = "SELECT $__timeInterval(t) WHERE $__timeFilter(t)"
    expanded = expand_alert_query(sql, now=now, relative_from_s=10_800, interval_ms=60_000)
    start = int((now - timedelta(hours=3)).timestamp())
    assert expanded == (
        f"SELECT toStartOfInterval(toDateTime(t), INTERVAL 60 second) WHERE t >= toDateTime({start}) "
        f"AND t <= toDateTime({int(now.timestamp())})"
    )
    # Without intervalMs Grafana uses 1000 ms: one-second buckets.
    assert "INTERVAL 1 second" in expand_alert_query(sql, now=now, relative_from_s=600)


# -- template variables --------------------------------------------------------------------------

DOMAINS = ("cad", "code", "o'brien")


def test_singlequote_escapes_quotes_with_a_backslash() -> None:
    variables = {"domain": Variable.many(["cad", "o'brien"], DOMAINS)}
    assert interpolate_variables("IN (${domain:singlequote})", variables) == "IN ('cad','o\\'brien')"


def test_all_expands_to_every_option_and_conditional_all_to_one_equals_one() -> None:
    variables = {"domain": Variable.all(DOMAINS), "run": Variable.single("demo")}
    sql = "WHERE run_id IN (${run:singlequote}) AND $__conditionalAll(domain IN (${domain:singlequote}), $domain)"
    assert interpolate_variables(sql, variables) == "WHERE run_id IN ('demo') AND 1=1"
    assert interpolate_variables("${domain:singlequote}", variables) == "'cad','code','o\\'brien'"


def test_conditional_all_keeps_the_condition_for_a_selection_and_drops_it_when_empty() -> None:
    sql = "$__conditionalAll(domain IN (${domain:singlequote}), ${domain})"
    assert interpolate_variables(sql, {"domain": Variable.many(["cad"], DOMAINS)}) == "domain IN ('cad')"
    assert interpolate_variables(sql, {"domain": Variable.many([], DOMAINS)}) == "1=1"
    nested = "$__conditionalAll(f(a, b) AND domain IN (${domain:singlequote}), $domain) AND x"
    assert interpolate_variables(nested, {"domain": Variable.many(["code"])}) == "f(a, b) AND domain IN ('code') AND x"
    with pytest.raises(MacroError):
        interpolate_variables("$__conditionalAll(a)", {"domain": Variable.many(["code"])})
    inner = "$__conditionalAll(run = 'x' AND $__conditionalAll(domain = 'y', $domain), $run)"
    both = {"run": Variable.many(["x"]), "domain": Variable.all(DOMAINS)}
    assert interpolate_variables(inner, both) == "run = 'x' AND 1=1"


def test_default_and_other_formats() -> None:
    multi = {"d": Variable.many(["a", "b'c"])}
    assert interpolate_variables("$d|${d}", multi) == "'a','b'c'|'a','b'c'"  # default: quoted, not escaped
    assert interpolate_variables("${d:csv}|${d:doublequote}|${d:sqlstring}", multi) == (
        "a,b'c|\"a\",\"b'c\"|'a','b''c'"
    )
    single = {"run": Variable.single("demo")}
    assert interpolate_variables("$run ${run} ${run:singlequote}", single) == "demo demo 'demo'"
    assert interpolate_variables("$run_id $other ${other:csv} $__timeFilter(x)", single) == (
        "$run_id $other ${other:csv} $__timeFilter(x)"
    )


def test_a_panel_query_gets_variables_first_then_backend_macros() -> None:
    sql = ("SELECT $__timeInterval(window_start) AS time FROM v_budget WHERE run_id IN (${run:singlequote}) "
           "AND $__conditionalAll(domain IN (${domain:singlequote}), $domain) AND $__timeFilter(window_start)")
    variables = {"run": Variable.single("demo"), "domain": Variable.many(["cad"], DOMAINS)}
    assert expand_panel_query(sql, time_range=RANGE, interval_ms=60_000, variables=variables) == (
        "SELECT toStartOfInterval(toDateTime(window_start), INTERVAL 60 second) AS time FROM v_budget "
        f"WHERE run_id IN ('demo') AND domain IN ('cad') AND window_start >= {D_FROM} AND window_start <= {D_TO}"
    )


# -- intervals -----------------------------------------------------------------------------------


def test_grafana_interval_rounding_and_minimum() -> None:
    assert round_interval_ms(7_200) == 5_000
    assert round_interval_ms(86_400) == 60_000
    assert round_interval_ms(172_800) == 120_000
    hour = TimeRange(FROM, FROM + timedelta(hours=2))
    assert panel_interval_ms(hour, max_data_points=1000, min_interval="1m") == 60_000
    week = TimeRange(FROM, FROM + timedelta(days=7))
    assert panel_interval_ms(week, max_data_points=1000, min_interval="1m") == 600_000
    assert parse_duration_ms("500ms") == 500 and parse_duration_ms("2h") == 7_200_000
    assert parse_duration_ms("30") == 30_000


def test_time_range_needs_aware_ordered_bounds() -> None:
    with pytest.raises(MacroError):
        TimeRange(datetime(2026, 1, 1), datetime(2026, 1, 2))  # noqa: DTZ001 - the point of the test
    with pytest.raises(MacroError):
        TimeRange(TO, FROM)
