"""``rollout audit``: recompute a run's metrics from its raw events in SQL and compare with the stream's views."""

from __future__ import annotations

import sys
from enum import StrEnum
from typing import Annotated, Any

import orjson
import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from infra.clickhouse.reader import QueryResult, query
from rollout.cli_support import console, fail, load_settings
from rollout.errors import RolloutError
from streams.audit import AuditReport, UnknownRun, audit_run
from streams.regression import RegressionConfig

EXAMPLES = 20
"""How many differences the table output shows."""

_HELP_PARAGRAPHS = (
    "Audit one run: recompute every metric family from the raw events (events_raw) with plain SQL,"
    " independently of the stream's code, and compare with what the stream wrote (the v_* views).",
    "The SQL re-assembles each trajectory from its events (deduplicated by event id, in event-time"
    " order: first queue and start, last finish; the latest verdict within the verdict timeout; decided ="
    " environment-valid, passed/failed, verified digest equal to the artifact's; policy lag at finish"
    " and at consumption) and recomputes the window rows of v_effective_throughput, v_env_failures,"
    " v_domain_quality, v_policy_lag (finish and consumption), v_timing, v_interruptions, v_budget,"
    " v_snapshots, v_verifier_integrity, v_undecidable and v_environment_versions. It also compares"
    " each trajectory's record in"
    " v_trajectories (the fields the metrics use) and the firing alerts of v_alerts with those the"
    " regression check gives on per-domain, per-version counts recomputed from the raw events.",
    "Rows are matched on their keys (domain, window start and the family's own keys); counts must be"
    " equal, floats within 1e-9, NULL equals NULL. A window with no finished trajectory counts"
    " as all zeros. Window size, verdict timeout, default staleness bound and regression thresholds"
    " come from the same settings as the worker's (ROLLOUT_METRICS_WINDOW_SECONDS, ...).",
    "Audit a run once the worker has consumed its events: while events still arrive, the raw events"
    " can be a batch ahead of the stream's rows.",
    "Exit code: 0 when nothing differs, 1 when something does, 2 when the audit cannot run (unknown"
    " run, ClickHouse unreachable or inconsistent, bad arguments).",
    "Examples:",
    "rollout audit --run golden",
    "rollout audit --run demo --format json",
)
HELP = "\n\n".join(_HELP_PARAGRAPHS)


class OutputFormat(StrEnum):
    """How the report is printed."""

    TABLE = "table"
    JSON = "json"


def register(app: typer.Typer) -> None:
    """Add the audit command."""
    app.command("audit", help=HELP)(audit)


def audit(
    run: Annotated[str, typer.Option("--run", "-r", help="The run to audit (its run_id).", show_default=False)],
    output: Annotated[OutputFormat, typer.Option("--format", "-f", help="table or json.")] = OutputFormat.TABLE,
) -> None:
    """Recompute a run's metrics from its raw events in SQL and compare with the stream's views."""
    settings = load_settings()

    def read(sql: str, parameters: dict[str, Any]) -> QueryResult:
        return query(settings, sql, parameters)

    try:
        report = audit_run(
            read, run,
            window_s=settings.metrics_window_seconds,
            verdict_timeout_s=settings.verdict_timeout_seconds,
            default_staleness_bound=settings.default_staleness_bound,
            regression=RegressionConfig(min_decided=settings.regression_min_decided,
                                        min_drop=settings.regression_min_drop, alpha=settings.regression_alpha),
        )
    except UnknownRun as exc:
        fail(str(exc), code=2)
    except RolloutError as exc:
        fail(f"the audit could not run: {exc}", code=2)
    if output is OutputFormat.JSON:
        sys.stdout.write(orjson.dumps(report.as_dict(), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        render(report)
    raise typer.Exit(1 if report.total else 0)


def render(report: AuditReport, examples: int = EXAMPLES) -> None:
    """Print the per-family table, up to ``examples`` differences and the final count line."""
    console.print(f"[bold]audit of run[/] [cyan]{escape(report.run_id)}[/]: {report.raw_events:,} raw events, "
                  f"{report.window_s}s windows", highlight=False)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1), collapse_padding=True)
    table.add_column("family", no_wrap=True)
    for header in ("rows\naudit", "rows\nstream", "matched", "only\naudit", "only\nstream", "values\ndiffer",
                   "diffs"):
        table.add_column(header, justify="right", no_wrap=True)
    for family in report.families:
        kinds = [d.kind for d in family.differences]
        style = "red" if family.differences else "green"
        table.add_row(family.family, str(family.audit_rows), str(family.stream_rows),
                      str(family.compared), str(kinds.count("missing_in_stream")),
                      str(kinds.count("missing_in_audit")), str(kinds.count("value")),
                      f"[{style}]{len(family.differences)}[/]")
    console.print(table)
    differences = report.differences
    if differences:
        shown = Table("family", "key", "difference", title=f"first {min(examples, len(differences))} of "
                      f"{len(differences)} differences", title_justify="left")
        for difference in differences[:examples]:
            shown.add_row(difference.family, escape(difference.key_text()), escape(difference.describe()))
        console.print(shown)
    console.print(f"audit: {report.total} differences", style="bold red" if report.total else "bold green",
                  highlight=False)
