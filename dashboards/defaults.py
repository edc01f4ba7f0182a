"""House defaults for every dashboard, panel, query and alert rule: change them here, nowhere else."""

from __future__ import annotations

from enum import IntEnum

from grafana_foundation_sdk.builders import common as common_builder
from grafana_foundation_sdk.builders import dashboard as dashboard_builder
from grafana_foundation_sdk.builders import table, timeseries
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import runtime as cogruntime
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as dashboard_model

# -- the data source -----------------------------------------------------------------------------

DATASOURCE_TYPE = "grafana-clickhouse-datasource"
"""Plugin id of the ClickHouse data source."""
DATASOURCE_UID = "rollout-clickhouse"
"""The provisioned data source's fixed uid: alert rules name it; dashboards default to it."""
DATASOURCE_NAME = "ClickHouse (rollout)"
DATASOURCE_VARIABLE = "datasource"
"""Name of the dashboards' data source variable; panels query ``${datasource}``."""
PLUGIN_VERSION = "4.20.0"
"""Written into every query model, so the editor never treats a query as an old v3 one."""

# -- where things live ---------------------------------------------------------------------------

FOLDER_UID = "rollout"
FOLDER_TITLE = "Rollout"
TAGS = ("rollout", "rl-post-training")

OVERVIEW_UID = "rollout-overview"
DOMAIN_UID = "rollout-domain"
ENVIRONMENT_UID = "rollout-environment"
VERIFIER_UID = "rollout-verifier"

# -- dashboards ----------------------------------------------------------------------------------

TIME_FROM = "now-6h"
TIME_TO = "now"
REFRESH = "1m"
TIMEZONE = "utc"
MIN_INTERVAL = "1m"
"""Panels never bucket finer than one metric window (ROLLOUT_METRICS_WINDOW_SECONDS, default 60 s)."""
MAX_DATA_POINTS = 1000
"""Points per series at most: with a 1-minute minimum, buckets are 1 minute up to ~16 h of range."""

FULL, HALF, THIRD, QUARTER = 24, 12, 8, 6
HEIGHT = 8
TABLE_HEIGHT = 9

# Units (Grafana unit ids).
UNIT_PER_HOUR = "suffix: /h"
UNIT_RATIO = "percentunit"
UNIT_COUNT = "short"
UNIT_SECONDS = "s"
UNIT_BYTES = "bytes"
UNIT_VERSIONS = "suffix: versions"

# -- alert rules ---------------------------------------------------------------------------------

ALERT_GROUP = "rollout"
ALERT_INTERVAL = "1m"
ALERT_INTERVAL_SECONDS = 60
ALERT_RANGE_SECONDS = 3 * 3600
"""Alert queries look at the last 3 hours: a run's recent windows and the baseline before them."""
ALERT_QUERY_INTERVAL_MS = 60_000
ALERT_MAX_DATA_POINTS = 43_200
ORG_ID = 1
CONTACT_POINT = "rollout-webhook"
CONTACT_POINT_UID = "rollout-webhook"
WEBHOOK_URL_ENV = "ROLLOUT_ALERT_WEBHOOK_URL"
EXPRESSION_DATASOURCE_UID = "__expr__"

# Environment variables the provisioned data source reads (file provisioning expands $NAME).
CLICKHOUSE_ENV = {
    "host": "GRAFANA_CLICKHOUSE_HOST",
    "port": "GRAFANA_CLICKHOUSE_PORT",
    "protocol": "GRAFANA_CLICKHOUSE_PROTOCOL",
    "username": "GRAFANA_CLICKHOUSE_USER",
    "password": "GRAFANA_CLICKHOUSE_PASSWORD",
    "database": "GRAFANA_CLICKHOUSE_DATABASE",
}


class Format(IntEnum):
    """The ClickHouse plugin's ``format`` numbers."""

    TIME_SERIES = 0
    TABLE = 1


def panel_datasource() -> dashboard_model.DataSourceRef:
    """The data source reference of every panel and dashboard variable: the ``datasource`` variable."""
    return dashboard_model.DataSourceRef(type_val=DATASOURCE_TYPE, uid="${" + DATASOURCE_VARIABLE + "}")


def clickhouse_query(sql: str, *, fmt: Format, ref_id: str = "A",
                     datasource_uid: str = "${" + DATASOURCE_VARIABLE + "}") -> dict[str, object]:
    """The plugin's query model for a raw SQL query (editor "sql", numeric format, pinned plugin version)."""
    return {
        "refId": ref_id,
        "datasource": {"type": DATASOURCE_TYPE, "uid": datasource_uid},
        "editorType": "sql",
        "pluginVersion": PLUGIN_VERSION,
        "queryType": "timeseries" if fmt is Format.TIME_SERIES else "table",
        "format": int(fmt),
        "rawSql": sql,
    }


class ClickHouseQuery(cogbuilder.Builder[cogvariants.Dataquery]):
    """A ClickHouse query for the SDK: the SDK has no ClickHouse builder, so it rides in the generic variant."""

    def __init__(self, sql: str, *, fmt: Format, ref_id: str = "A",
                 datasource_uid: str = "${" + DATASOURCE_VARIABLE + "}") -> None:
        self._model = clickhouse_query(sql, fmt=fmt, ref_id=ref_id, datasource_uid=datasource_uid)

    def build(self) -> cogvariants.Dataquery:
        """The query as an SDK data query."""
        return cogruntime.UnknownDataquery(dict(self._model))


# -- variables -----------------------------------------------------------------------------------


def datasource_variable() -> dashboard_builder.DatasourceVariable:
    """The data source picker every dashboard starts with (the dashboard-linter convention)."""
    return (
        dashboard_builder.DatasourceVariable(DATASOURCE_VARIABLE)
        .label("Data source")
        .type(DATASOURCE_TYPE)
        .current(dashboard_model.VariableOption(text=DATASOURCE_NAME, value=DATASOURCE_UID, selected=True))
    )


def query_variable(name: str, label: str, sql: str, *, multi: bool, include_all: bool,
                   description: str) -> dashboard_builder.QueryVariable:
    """A variable whose options come from a ClickHouse query, refreshed when the time range changes."""
    return (
        dashboard_builder.QueryVariable(name)
        .label(label)
        .description(description)
        .datasource(panel_datasource())
        .query(sql)
        .refresh(dashboard_model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dashboard_model.VariableSort.ALPHABETICAL_ASC)
        .multi(multi)
        .include_all(include_all)
    )


# -- panels --------------------------------------------------------------------------------------


def time_series(title: str, description: str, *, unit: str, sql: str, width: int = HALF,
                height: int = HEIGHT, stacked: bool = False, bars: bool = False,
                min_value: float | None = None, max_value: float | None = None) -> timeseries.Panel:
    """A time-series panel in house style: one ClickHouse query, legend as a table with mean and max."""
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(panel_datasource())
        .with_target(ClickHouseQuery(sql, fmt=Format.TIME_SERIES))
        .unit(unit)
        .interval(MIN_INTERVAL)
        .max_data_points(MAX_DATA_POINTS)
        .span(width)
        .height(height)
        .line_width(1)
        .fill_opacity(25 if stacked or bars else 10)
        .show_points(common.VisibilityMode.NEVER)
        .span_nulls(False)
        .legend(timeseries_legend())
        .tooltip(common_tooltip())
    )
    if bars:
        panel = panel.draw_style(common.GraphDrawStyle.BARS)
    if stacked:
        panel = panel.stacking(_stacking())
    if min_value is not None:
        panel = panel.min(min_value)
    if max_value is not None:
        panel = panel.max(max_value)
    return panel


def timeseries_legend() -> common_builder.VizLegendOptions:
    """Legend as a table below the chart, with mean and max."""
    return (
        common_builder.VizLegendOptions()
        .display_mode(common.LegendDisplayMode.TABLE)
        .placement(common.LegendPlacement.BOTTOM)
        .show_legend(True)
        .calcs(["mean", "max"])
    )


def common_tooltip() -> common_builder.VizTooltipOptions:
    """Tooltip with every series, sorted by value."""
    return (
        common_builder.VizTooltipOptions()
        .mode(common.TooltipDisplayMode.MULTI)
        .sort(common.SortOrder.DESCENDING)
    )


def _stacking() -> common_builder.StackingConfig:
    return common_builder.StackingConfig().mode(common.StackingMode.NORMAL)


def table_panel(title: str, description: str, *, unit: str, sql: str, width: int = HALF,
                height: int = TABLE_HEIGHT, column_units: dict[str, str] | None = None,
                sort_by: str | None = None, descending: bool = True) -> table.Panel:
    """A table panel in house style: one ClickHouse query (table format); per-column units override ``unit``."""
    panel = (
        table.Panel()
        .title(title)
        .description(description)
        .datasource(panel_datasource())
        .with_target(ClickHouseQuery(sql, fmt=Format.TABLE))
        .unit(unit)
        .span(width)
        .height(height)
        .show_header(True)
    )
    for column, column_unit in sorted((column_units or {}).items()):
        panel = panel.override_by_name(
            column, [dashboard_model.DynamicConfigValue(id_val="unit", value=column_unit)]
        )
    if sort_by is not None:
        panel = panel.sort_by([common_builder.TableSortByFieldState().display_name(sort_by).desc(descending)])
    return panel
