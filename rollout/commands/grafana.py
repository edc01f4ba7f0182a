"""``rollout grafana``: build the dashboards, alert rules and provisioning files, or push them to a Grafana."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from rollout.cli_support import console, fail
from rollout.errors import RolloutError

BUILD_HELP = (
    "Write dashboards/generated/*.json and infra/grafana/provisioning/ (data source, dashboard provider, "
    "alert rules, contact point, notification policy) from the dashboards/ package.\n\n"
    "The files are committed; a test fails when they differ from a fresh build. With --check nothing is "
    "written and the exit code is 1 when a file is missing, changed or stale."
)
PUSH_HELP = (
    "Create or update the Rollout folder, the ClickHouse data source, the dashboards and the alert rules "
    "on a running Grafana through its HTTP API (idempotent: run it again after every change).\n\n"
    "Authenticate with --token (a service account token with the Admin role) or user:password in the "
    "URL. The ClickHouse options say how the Grafana server reaches ClickHouse; use a read-only user. "
    "With --webhook-url the webhook contact point and the notification policy are pushed too (the "
    "policy replaces Grafana's whole notification policy tree).\n\n"
    "Example: rollout grafana push --url http://localhost:3000 --token $GRAFANA_TOKEN "
    "--clickhouse-host clickhouse --clickhouse-password $GRAFANA_CLICKHOUSE_PASSWORD"
)


def register(app: typer.Typer) -> None:
    """Add the ``grafana`` sub-commands."""
    sub = typer.Typer(
        name="grafana",
        help="Grafana as code: dashboards, alert rules and provisioning built from dashboards/, pushed over HTTP.",
        no_args_is_help=True,
    )
    sub.command("build", help=BUILD_HELP)(build)
    sub.command("push", help=PUSH_HELP)(push)
    app.add_typer(sub)


def build(
    check: Annotated[bool, typer.Option("--check", help="Compare only; exit 1 when files differ.")] = False,
    root: Annotated[
        Path | None,
        typer.Option("--root", help="Project root to write under (default: this checkout).", show_default=False),
    ] = None,
) -> None:
    """Write (or check) every generated Grafana file."""
    from dashboards.build import ROOT, drift, render, write

    target = (root or ROOT).resolve()
    try:
        files = render()
    except RolloutError as exc:
        fail(str(exc))
    _lint_or_fail(files)
    if check:
        differences = drift(target, files)
        if differences:
            console.print(differences.describe(), highlight=False)
            fail("generated Grafana files are out of date: run `rollout grafana build`")
        console.print(f"{len(files)} generated files are up to date under {target}", highlight=False)
        return
    before = write(target)
    if before:
        console.print(before.describe(), highlight=False)
    console.print(f"wrote {len(files)} files under {target} ({'changed' if before else 'no change'})",
                  highlight=False)


def _lint_or_fail(files: dict[str, str]) -> None:
    from dashboards.lint import lint_files

    problems = lint_files(files)
    if problems:
        for problem in problems:
            console.print(f"  {problem}", highlight=False)
        fail(f"{len(problems)} problem(s) in the generated dashboards or alert rules")


def push(
    url: Annotated[str, typer.Option("--url", envvar="GRAFANA_URL", help="Grafana's base URL.", show_default=False)],
    token: Annotated[
        str | None,
        typer.Option("--token", envvar="GRAFANA_TOKEN", help="Service account token (Admin role).",
                     show_default=False),
    ] = None,
    clickhouse_host: Annotated[
        str, typer.Option("--clickhouse-host", envvar="GRAFANA_CLICKHOUSE_HOST",
                          help="ClickHouse host as the Grafana server sees it.")
    ] = "localhost",
    clickhouse_port: Annotated[
        int, typer.Option("--clickhouse-port", envvar="GRAFANA_CLICKHOUSE_PORT", min=1, max=65535,
                          help="9000 for native, 8123 for http.")
    ] = 9000,
    clickhouse_protocol: Annotated[
        str, typer.Option("--clickhouse-protocol", envvar="GRAFANA_CLICKHOUSE_PROTOCOL", help="native or http.")
    ] = "native",
    clickhouse_user: Annotated[
        str, typer.Option("--clickhouse-user", envvar="GRAFANA_CLICKHOUSE_USER", help="A read-only ClickHouse user.")
    ] = "grafana",
    clickhouse_password: Annotated[
        str, typer.Option("--clickhouse-password", envvar="GRAFANA_CLICKHOUSE_PASSWORD", show_default=False,
                          help="Its password (stored encrypted by Grafana).")
    ] = "",
    clickhouse_database: Annotated[
        str, typer.Option("--clickhouse-database", envvar="GRAFANA_CLICKHOUSE_DATABASE",
                          help="Database holding the v_* views.")
    ] = "rollout",
    webhook_url: Annotated[
        str | None,
        typer.Option("--webhook-url", envvar="ROLLOUT_ALERT_WEBHOOK_URL", show_default=False,
                     help="Webhook receiving alert notifications; pushes the contact point and policy."),
    ] = None,
    timeout: Annotated[float, typer.Option("--timeout", min=0.1, help="Seconds per HTTP request.")] = 10.0,
) -> None:
    """Create or update the Grafana objects over HTTP."""
    from dashboards.push import ClickHouseConnection
    from dashboards.push import push as push_all

    if clickhouse_protocol not in ("native", "http"):
        fail(f"--clickhouse-protocol must be native or http, not {clickhouse_protocol!r}")
    connection = ClickHouseConnection(
        host=clickhouse_host, port=clickhouse_port, protocol=clickhouse_protocol,  # type: ignore[arg-type]
        username=clickhouse_user, password=clickhouse_password, database=clickhouse_database,
    )
    try:
        report = push_all(url=url, token=token, clickhouse=connection, webhook_url=webhook_url, timeout=timeout)
    except RolloutError as exc:
        fail(str(exc))
    table = Table("object", "name", "action", title=f"Grafana {report.grafana_version}".strip(),
                  title_justify="left")
    for kind, name, action in report.changes:
        table.add_row(kind, name, action)
    console.print(table)
