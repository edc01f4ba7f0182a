"""The queries Grafana sends: every dashboard panel target, the two variable queries, every alert rule query.

Panel targets come from the generated dashboards (``dashboards/generated``), alert queries from the
provisioned rules; both are expanded by ``dashboards.macros`` exactly as Grafana and the ClickHouse
plugin expand them, for a given time range and variables.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import yaml

from dashboards import queries
from dashboards.macros import TimeRange, Variable, expand_alert_query, expand_panel_query, panel_interval_ms

REPO = Path(__file__).resolve().parents[1]
GENERATED = REPO / "dashboards" / "generated"
RULES_FILE = REPO / "infra" / "grafana" / "provisioning" / "alerting" / "rules.yaml"
DRILL_DOWN_BOARD = "rollout-domain"
"""The board whose ``domain`` variable is a single domain; the others select All domains."""


@dataclass(frozen=True, slots=True)
class QueryCase:
    """One query as a dashboard or rule holds it, before expansion."""

    kind: str  # panel | variable | alert
    board: str
    title: str
    ref: str
    sql: str
    max_data_points: int = 1000
    min_interval: str | None = None
    relative_from_s: int = 0
    relative_to_s: int = 0
    interval_ms: int = 1000

    @property
    def name(self) -> str:
        """``board / title [ref]``."""
        return f"{self.board} / {self.title} [{self.ref}]"


def panel_cases(generated: Path = GENERATED) -> list[QueryCase]:
    """Every target of every non-row panel of the generated dashboards, in file and panel order."""
    cases: list[QueryCase] = []
    for path in sorted(generated.glob("*.json")):
        board = json.loads(path.read_text())
        for panel in board["panels"]:
            if panel["type"] == "row":
                continue
            for target in panel["targets"]:
                cases.append(QueryCase(
                    kind="panel", board=path.stem, title=panel["title"], ref=target["refId"], sql=target["rawSql"],
                    max_data_points=int(panel.get("maxDataPoints") or 1000), min_interval=panel.get("interval"),
                ))
    return cases


def variable_cases() -> list[QueryCase]:
    """The run and domain variable queries every dashboard shares."""
    return [QueryCase("variable", "variables", "run options", "run", queries.RUN_OPTIONS),
            QueryCase("variable", "variables", "domain options", "domain", queries.DOMAIN_OPTIONS)]


def alert_cases(rules_file: Path = RULES_FILE) -> list[QueryCase]:
    """Every ClickHouse query of every provisioned alert rule."""
    document = yaml.safe_load(rules_file.read_text())
    cases: list[QueryCase] = []
    for group in document["groups"]:
        for rule in group["rules"]:
            for item in rule["data"]:
                if item["datasourceUid"] == "__expr__":
                    continue
                span = item["relativeTimeRange"]
                cases.append(QueryCase(
                    kind="alert", board="alert rules", title=rule["title"], ref=item["refId"],
                    sql=item["model"]["rawSql"], relative_from_s=int(span["from"]),
                    relative_to_s=int(span.get("to", 0)),
                    interval_ms=int(item["model"].get("intervalMs", 1000)),
                ))
    return cases


def expand(case: QueryCase, *, time_range: TimeRange, run: str, domains: list[str], drill_down: str) -> str:
    """The SQL ClickHouse receives for ``case``: a panel over ``time_range``, an alert evaluated at its end."""
    if case.kind == "alert":
        return expand_alert_query(case.sql, now=time_range.end, relative_from_s=case.relative_from_s,
                                  relative_to_s=case.relative_to_s, interval_ms=case.interval_ms)
    domain = Variable.single(drill_down) if case.board == DRILL_DOWN_BOARD else Variable.all(domains)
    interval = panel_interval_ms(time_range, max_data_points=case.max_data_points, min_interval=case.min_interval)
    return expand_panel_query(case.sql, time_range=time_range, interval_ms=interval,
                              variables={"run": Variable.single(run), "domain": domain})


def ranges(start: datetime, end: datetime) -> dict[str, TimeRange]:
    """The time ranges panels are measured over: the dashboards' default (last 6 h) and the whole data."""
    days = (end - start) / timedelta(days=1)
    return {"last 6 h": TimeRange(end - timedelta(hours=6), end), f"all {days:.0f} d": TimeRange(start, end)}
