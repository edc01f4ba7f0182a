"""Alert rules as code, with their contact point and notification policy, in both of Grafana's shapes.

Rules are built with the SDK's alerting builders, which serialise in the HTTP provisioning API's
shape (``folderUID``, ``ruleGroup``, group ``interval`` in seconds): ``rollout grafana push`` sends
that. File provisioning (``infra/grafana/provisioning/alerting/``) reads another shape, made here
from the same rules by :func:`rules_file`.

Every rule is the same pipeline: ``A`` a ClickHouse table query (one row per alert instance:
string columns are its labels, one numeric column its value) → ``B`` reduce (``last``; a table row
is already one number) → ``C`` threshold (``gt`` or ``lt``: Grafana's threshold expression has no
``gte``/``lte``). The condition is ``C``.

Labels and annotations template with ``.Labels`` and ``.Values``, never ``$labels``: file
provisioning expands ``$NAME`` environment variables in labels (and may in annotations), which
would eat ``$labels``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from grafana_foundation_sdk.builders import alerting, expr
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import runtime as cogruntime
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import alerting as alerting_model
from grafana_foundation_sdk.models import common

from dashboards import queries
from dashboards.defaults import (
    ALERT_GROUP,
    ALERT_INTERVAL,
    ALERT_INTERVAL_SECONDS,
    ALERT_MAX_DATA_POINTS,
    ALERT_QUERY_INTERVAL_MS,
    ALERT_RANGE_SECONDS,
    CONTACT_POINT,
    CONTACT_POINT_UID,
    DATASOURCE_UID,
    DOMAIN_UID,
    EXPRESSION_DATASOURCE_UID,
    FOLDER_TITLE,
    FOLDER_UID,
    ORG_ID,
    WEBHOOK_URL_ENV,
    Format,
    clickhouse_query,
)

Evaluator = Literal["gt", "lt", "within_range", "outside_range"]
NoData = Literal["NoData", "Alerting", "OK"]
ExecErr = Literal["Error", "Alerting", "OK"]

DRILL_DOWN_LINK = (
    f"/d/{DOMAIN_UID}?var-run={{{{ .Labels.run }}}}&var-domain={{{{ .Labels.domain }}}}&from=now-6h&to=now"
)
"""Annotation link from an alert instance to the domain drill-down of its run and domain."""


@dataclass(frozen=True, slots=True)
class RuleSpec:
    """What makes one rule: its query, how its value is judged, and what a notification says."""

    uid: str
    title: str
    sql: str
    evaluator: Evaluator
    params: tuple[float, ...]
    pending: str
    no_data: NoData
    exec_err: ExecErr
    severity: Literal["critical", "warning"]
    summary: str
    description: str


class _AlertQuery(cogbuilder.Builder[cogvariants.Dataquery]):
    """The ClickHouse query model of a rule: table format, fixed data source uid, explicit interval."""

    def __init__(self, sql: str) -> None:
        model: dict[str, object] = clickhouse_query(sql, fmt=Format.TABLE, datasource_uid=DATASOURCE_UID)
        model["intervalMs"] = ALERT_QUERY_INTERVAL_MS
        model["maxDataPoints"] = ALERT_MAX_DATA_POINTS
        self._model = model

    def build(self) -> cogvariants.Dataquery:
        """The model as an SDK data query."""
        return cogruntime.UnknownDataquery(dict(self._model))


def _expression_datasource() -> common.DataSourceRef:
    return common.DataSourceRef(type_val=EXPRESSION_DATASOURCE_UID, uid=EXPRESSION_DATASOURCE_UID)


def build_rule(spec: RuleSpec) -> alerting.Rule:
    """An SDK rule from a spec: query A, reduce B (last), threshold C."""
    query = (
        alerting.Query("A")
        .datasource_uid(DATASOURCE_UID)
        .relative_time_range(alerting_model.RelativeTimeRange(from_val=ALERT_RANGE_SECONDS, to=0))
        .model(_AlertQuery(spec.sql))
    )
    reduce = (
        alerting.Query("B")
        .datasource_uid(EXPRESSION_DATASOURCE_UID)
        .model(
            expr.TypeReduce().ref_id("B").expression("A").reducer("last").datasource(_expression_datasource())
        )
    )
    threshold = (
        alerting.Query("C")
        .datasource_uid(EXPRESSION_DATASOURCE_UID)
        .model(
            expr.TypeThreshold()
            .ref_id("C")
            .expression("B")
            .datasource(_expression_datasource())
            .conditions([
                expr.ExprTypeThresholdConditions().evaluator(
                    expr.ExprTypeThresholdConditionsEvaluator().type(spec.evaluator).params(list(spec.params))
                )
            ])
        )
    )
    return (
        alerting.Rule(spec.title)
        .uid(spec.uid)
        .org_id(ORG_ID)
        .folder_uid(FOLDER_UID)
        .rule_group(ALERT_GROUP)
        .condition("C")
        .queries([query, reduce, threshold])
        .for_val(spec.pending)
        .no_data_state(spec.no_data)
        .exec_err_state(spec.exec_err)
        .is_paused(False)
        .labels({
            "severity": spec.severity,
            "run": "{{ .Labels.run }}",
            "domain": "{{ .Labels.domain }}",
        })
        .annotations({
            "summary": spec.summary,
            "description": spec.description,
            "dashboard_url": DRILL_DOWN_LINK,
        })
    )


# -- the rules -----------------------------------------------------------------------------------


def domain_regression() -> RuleSpec:
    """A domain's pass rate regressed on a policy version (the worker's statistical test is firing)."""
    return RuleSpec(
        uid="rollout-domain-regression",
        title="Domain pass rate regression",
        sql=queries.ALERT_DOMAIN_REGRESSION,
        evaluator="gt", params=(0.0,),
        pending="0s", no_data="OK", exec_err="Error", severity="critical",
        summary="Pass rate of {{ .Labels.domain }} regressed in run {{ .Labels.run }} "
                "(drop {{ humanizePercentage .Values.B.Value }})",
        description="A policy version's pass rate in this domain is significantly below that of the earlier "
                    "versions (one-sided two-proportion test, evaluated by the worker; see v_alerts). The "
                    "run's overall pass rate may still be rising: check the domain before promoting the policy.",
    )


def env_failure_spike() -> RuleSpec:
    """One environment failure class rose well above the run's earlier rate."""
    return RuleSpec(
        uid="rollout-env-failure-spike",
        title="Environment failure rate spike",
        sql=queries.ALERT_ENV_FAILURE_SPIKE,
        evaluator="gt", params=(0.10,),
        pending="5m", no_data="OK", exec_err="Error", severity="warning",
        summary="{{ .Labels.failure_class }} failures in {{ .Labels.domain }} (run {{ .Labels.run }}) are "
                "{{ humanizePercentage .Values.B.Value }} of finished trajectories above the run's earlier rate",
        description="Over the run's last 15 minutes, environment failures of this class rose by more than "
                    "10 points of the finished trajectories against the run's earlier windows (with at least "
                    "20 finished). Look for a broken dependency or a bad environment version.",
    )


def policy_lag_over_bound() -> RuleSpec:
    """The policy lag p95 at finish is above the run's staleness bound."""
    return RuleSpec(
        uid="rollout-policy-lag",
        title="Policy lag p95 over the staleness bound",
        sql=queries.ALERT_POLICY_LAG,
        evaluator="gt", params=(0.0,),
        pending="10m", no_data="OK", exec_err="Error", severity="warning",
        summary="Policy lag p95 in {{ .Labels.domain }} (run {{ .Labels.run }}) is "
                "{{ .Values.B.Value }} version(s) over the staleness bound",
        description="In the run's last 15 minutes the typical window's p95 of policy lag at finish exceeds the "
                    "run's staleness bound: rollouts run on policies older than training accepts.",
    )


def throughput_drop() -> RuleSpec:
    """Effective throughput fell to less than half its trailing baseline."""
    return RuleSpec(
        uid="rollout-throughput-drop",
        title="Effective throughput drop",
        sql=queries.ALERT_THROUGHPUT_DROP,
        evaluator="lt", params=(0.5,),
        pending="10m", no_data="OK", exec_err="Error", severity="warning",
        summary="Effective throughput of {{ .Labels.domain }} (run {{ .Labels.run }}) is at "
                "{{ humanizePercentage .Values.B.Value }} of its trailing baseline",
        description="Effective trajectories per hour over the run's last 15 complete minutes are below half "
                    "of the hour before (at least 30 minutes and 30 effective trajectories of baseline). "
                    "Check the environment failure rate, the decidable ratio and the finish rate.",
    )


def digest_mismatches() -> RuleSpec:
    """Verifiers checked another artifact than the sandbox produced."""
    return RuleSpec(
        uid="rollout-digest-mismatch",
        title="Verifier digest mismatches",
        sql=queries.ALERT_DIGEST_MISMATCHES,
        evaluator="gt", params=(0.0,),
        pending="0s", no_data="OK", exec_err="Error", severity="critical",
        summary="{{ .Values.B.Value }} verdict(s) of verifier {{ .Labels.verifier_version }} in "
                "{{ .Labels.domain }} (run {{ .Labels.run }}) checked another artifact than the sandbox produced",
        description="Verdicts whose verified digest differs from the sandbox's final artifact digest in the "
                    "run's last 15 minutes. They are excluded from training, but they mean a verifier or the "
                    "artifact pipeline is wrong.",
    )


RULES = (domain_regression, env_failure_spike, policy_lag_over_bound, throughput_drop, digest_mismatches)
"""Every rule, in the order of the group."""


def rule_specs() -> list[RuleSpec]:
    """Every rule's spec."""
    return [make() for make in RULES]


def rule_group() -> alerting_model.RuleGroup:
    """The SDK rule group (HTTP provisioning API shape)."""
    group = alerting.RuleGroup(ALERT_GROUP).folder_uid(FOLDER_UID).interval(ALERT_INTERVAL_SECONDS)
    return group.rules([build_rule(spec) for spec in rule_specs()]).build()


def to_plain(value: object) -> Any:
    """SDK objects as plain JSON values (dicts, lists, numbers, strings)."""
    return json.loads(json.dumps(value, cls=JSONEncoder))


def api_rule_group() -> dict[str, Any]:
    """The rule group as the HTTP provisioning API takes it (PUT …/folder/{uid}/rule-groups/{group})."""
    plain: dict[str, Any] = to_plain(rule_group())
    return plain


def _file_rule(api_rule: dict[str, Any]) -> dict[str, Any]:
    keep = ("uid", "title", "condition", "data", "for", "noDataState", "execErrState", "labels",
            "annotations", "isPaused")
    return {key: api_rule[key] for key in keep if key in api_rule}


def rules_file() -> dict[str, Any]:
    """The rule group in Grafana's file-provisioning shape (``groups[].rules[]``, folder by title)."""
    api = api_rule_group()
    return {
        "apiVersion": 1,
        "groups": [{
            "orgId": ORG_ID,
            "name": ALERT_GROUP,
            "folder": FOLDER_TITLE,
            "interval": ALERT_INTERVAL,
            "rules": [_file_rule(rule) for rule in api["rules"]],
        }],
    }


def contact_point(url: str = "$" + WEBHOOK_URL_ENV) -> dict[str, Any]:
    """The webhook contact point (HTTP API shape); the URL defaults to the environment variable."""
    point = (
        alerting.ContactPoint()
        .uid(CONTACT_POINT_UID)
        .name(CONTACT_POINT)
        .type("webhook")
        .settings({"url": url, "httpMethod": "POST"})
        .disable_resolve_message(False)
    )
    plain: dict[str, Any] = to_plain(point.build())
    return plain


def contact_points_file() -> dict[str, Any]:
    """The contact point in the file-provisioning shape."""
    point = contact_point()
    return {
        "apiVersion": 1,
        "contactPoints": [{
            "orgId": ORG_ID,
            "name": point["name"],
            "receivers": [{
                "uid": point["uid"],
                "type": point["type"],
                "settings": point["settings"],
                "disableResolveMessage": point["disableResolveMessage"],
            }],
        }],
    }


def notification_policy() -> dict[str, Any]:
    """The notification policy tree (HTTP API shape): everything to the webhook, grouped by run and domain."""
    policy = (
        alerting.NotificationPolicy()
        .receiver(CONTACT_POINT)
        .group_by(["grafana_folder", "alertname", "run", "domain"])
        .group_wait("30s")
        .group_interval("5m")
        .repeat_interval("4h")
    )
    plain: dict[str, Any] = to_plain(policy.build())
    return plain


def policies_file() -> dict[str, Any]:
    """The notification policy in the file-provisioning shape."""
    return {"apiVersion": 1, "policies": [{"orgId": ORG_ID, **notification_policy()}]}
