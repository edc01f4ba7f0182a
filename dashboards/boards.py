"""The four dashboards, assembled from panels, rows and variables; each has a stable uid."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from grafana_foundation_sdk.builders import dashboard as dashboard_builder
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.models import dashboard as dashboard_model

from dashboards import panels, queries
from dashboards.defaults import (
    DOMAIN_UID,
    ENVIRONMENT_UID,
    OVERVIEW_UID,
    REFRESH,
    TAGS,
    TIME_FROM,
    TIME_TO,
    TIMEZONE,
    VERIFIER_UID,
    datasource_variable,
    query_variable,
)

Section = tuple[str, Sequence[cogbuilder.Builder[dashboard_model.Panel]]]
"""A row title and the panels under it."""


def run_variable() -> dashboard_builder.QueryVariable:
    """The run to show: one RL run at a time (runs with windows in the time range)."""
    return query_variable(
        "run", "Run", queries.RUN_OPTIONS, multi=False, include_all=False,
        description="The RL run (run_id). Lists runs with metric windows in the time range.",
    )


def domains_variable() -> dashboard_builder.QueryVariable:
    """The domains to show: several, or All."""
    return query_variable(
        "domain", "Domain", queries.DOMAIN_OPTIONS, multi=True, include_all=True,
        description="Task domains of the run; All shows every domain.",
    )


def domain_variable() -> dashboard_builder.QueryVariable:
    """One domain, for the drill-down."""
    return query_variable(
        "domain", "Domain", queries.DOMAIN_OPTIONS, multi=False, include_all=False,
        description="The task domain to drill into.",
    )


def _links() -> list[cogbuilder.Builder[dashboard_model.DashboardLink]]:
    return [
        dashboard_builder.DashboardLink("Rollout dashboards")
        .type(dashboard_model.DashboardLinkType.DASHBOARDS)
        .tags([TAGS[0]])
        .as_dropdown(True)
        .include_vars(True)
        .keep_time(True),
    ]


def _dashboard(uid: str, title: str, description: str, *, domain: dashboard_builder.QueryVariable,
               sections: Sequence[Section]) -> dashboard_model.Dashboard:
    """A dashboard in house style: variables, links, rows of panels, then stable panel ids."""
    board = (
        dashboard_builder.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(list(TAGS))
        .readonly()
        .timezone(TIMEZONE)
        .time(TIME_FROM, TIME_TO)
        .refresh(REFRESH)
        .tooltip(dashboard_model.DashboardCursorSync.CROSSHAIR)
        .with_variable(datasource_variable())
        .with_variable(run_variable())
        .with_variable(domain)
        .links(_links())
    )
    for row_title, row_panels in sections:
        board = board.with_row(dashboard_builder.Row(row_title))
        for panel in row_panels:
            board = board.with_panel(panel)
    model = board.build()
    for number, item in enumerate(model.panels or [], start=1):
        item.id_val = number
    return model


def overview() -> dashboard_model.Dashboard:
    """Rollout overview: throughput and its factors, failures, pass rate, policy lag, open alerts."""
    return _dashboard(
        OVERVIEW_UID, "Rollout overview",
        "One RL run at a glance: effective trajectories per hour and its three factors by domain, "
        "environment failures by class, pass rate by domain and policy version, policy lag and open "
        "regression alerts. Metrics are per one-minute window of event time.",
        domain=domains_variable(),
        sections=[
            ("Effective throughput", [
                panels.effective_per_hour(), panels.env_failure_rate_by_class(),
                panels.finished_per_hour(), panels.env_validity(), panels.decidable_ratio(),
            ]),
            ("Quality and policy lag", [
                panels.pass_rate_by_domain_and_version(), panels.policy_lag(),
                panels.share_over_bound(), panels.timing(),
            ]),
            ("Alerts", [panels.open_alerts()]),
        ],
    )


def domain_drill_down() -> dashboard_model.Dashboard:
    """Domain drill-down: one domain's versions, failure classes, timing and budget share."""
    return _dashboard(
        DOMAIN_UID, "Domain drill-down",
        "One domain of one run: its throughput funnel, pass rate per policy version and regression alerts, "
        "failure classes, wait and run times, budget share and interruptions. Alert notifications link here.",
        domain=domain_variable(),
        sections=[
            ("Throughput", [panels.domain_throughput()]),
            ("Policy versions", [
                panels.pass_rate_by_version_over_time(), panels.pass_rate_by_domain_and_version(),
                panels.domain_alerts(),
            ]),
            ("Failures", [panels.failures_by_origin_class(), panels.failure_classes_table()]),
            ("Time and budget", [
                panels.timing(), panels.budget_share(), panels.effective_per_sandbox_hour(),
                panels.interruptions_by_reason(),
            ]),
        ],
    )


def environment_health() -> dashboard_model.Dashboard:
    """Environment health: failure rates by class and environment version, snapshots and resumes."""
    return _dashboard(
        ENVIRONMENT_UID, "Environment health",
        "Sandbox environments of one run: environment failure rates by class and environment version, "
        "failures by origin, snapshots, resumes and interruptions.",
        domain=domains_variable(),
        sections=[
            ("Environment failures", [
                panels.env_failure_rate_by_class(), panels.env_failures_by_version(),
                panels.env_failure_rate_by_version_table(), panels.failure_classes_table(),
            ]),
            ("Snapshots and resumes", [
                panels.snapshots_and_resumes(), panels.resume_success(),
                panels.snapshot_bytes(), panels.interruptions_by_reason(),
            ]),
        ],
    )


def verifier_integrity() -> dashboard_model.Dashboard:
    """Verifier integrity: digest mismatches, verdicts per verifier version, undecidable reasons."""
    return _dashboard(
        VERIFIER_UID, "Verifier integrity",
        "Verifiers of one run: digest mismatches, verdict outcomes per verifier version, sandboxes that "
        "claimed completion but failed, and why env-valid trajectories were not decided.",
        domain=domains_variable(),
        sections=[
            ("Integrity", [panels.digest_mismatches(), panels.claimed_complete_failed()]),
            ("Verdicts", [
                panels.verdicts_by_verifier(), panels.verdict_outcomes(), panels.undecidable_reasons(),
            ]),
            ("Decidability", [panels.decidable_ratio()]),
        ],
    )


DASHBOARDS: tuple[Callable[[], dashboard_model.Dashboard], ...] = (
    overview, domain_drill_down, environment_health, verifier_integrity,
)
"""Every dashboard, in the order they are listed and written."""


def all_dashboards() -> list[dashboard_model.Dashboard]:
    """Build every dashboard."""
    return [build() for build in DASHBOARDS]
