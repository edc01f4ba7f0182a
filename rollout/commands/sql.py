"""``rollout sql``: read-only SQL on the platform's ClickHouse, as a table, CSV or JSON."""

from __future__ import annotations

import csv
import io
import sys
from enum import StrEnum
from typing import Any

import orjson
import typer
from rich.table import Table

from infra.clickhouse.reader import QueryResult, query
from rollout.cli_support import console, fail, load_settings


class OutputFormat(StrEnum):
    """How results are printed."""

    TABLE = "table"
    CSV = "csv"
    JSON = "json"


def register(app: typer.Typer) -> None:
    """Add the sql command."""
    app.command("sql")(sql)


def sql(
    statement: str = typer.Argument(..., help="One SELECT (or SHOW/DESCRIBE) statement."),
    output: OutputFormat = typer.Option(OutputFormat.TABLE, "--format", "-f", help="table, csv or json."),
    param: list[str] = typer.Option(
        [], "--param", "-p",
        help="Query parameter NAME=VALUE, used in the statement as {NAME:Type}; values are bound, never pasted.",
    ),
) -> None:
    """Run a read-only query on ClickHouse (reads go through the worker when it owns the embedded engine).

    Examples:

      rollout sql "SELECT event_type, count() FROM events_raw GROUP BY event_type"

      rollout sql -f csv -p run=system-a "SELECT count() FROM events_raw WHERE run_id = {run:String}"
    """
    parameters: dict[str, Any] = {}
    for item in param:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier():
            fail(f"--param takes NAME=VALUE, got {item!r}")
        parameters[name] = value
    result = query(load_settings(), statement, parameters)
    render(result, output)


def render(result: QueryResult, output: OutputFormat) -> None:
    """Print a result in the chosen format to standard output."""
    if output is OutputFormat.CSV:
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(result.columns)
        writer.writerows([[_plain(v) for v in row] for row in result.rows])
        sys.stdout.write(buffer.getvalue())
    elif output is OutputFormat.JSON:
        records = [dict(zip(result.columns, row, strict=True)) for row in result.rows]
        sys.stdout.write(orjson.dumps(records, default=str, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        table = Table(*result.columns, show_lines=False)
        for row in result.rows:
            table.add_row(*[_plain(v) for v in row])
        console.print(table)
        console.print(f"{len(result.rows)} row(s)", style="dim")


def _plain(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return str(value)
