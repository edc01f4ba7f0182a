"""Every dashboard panel query and alert rule query, expanded as Grafana would, runs on the real stack's ClickHouse.

One stack for the module (a worker on the test run's Kafka broker, its own topics and ClickHouse):
scenarios/default.yaml (every metric family), scenarios/regression.yaml (a domain regression),
scenarios/healthy.yaml (nothing wrong) and the two halves of tests/e2e/scenarios/surge-*.yaml (an
environment failure spike and a throughput drop in one run). Then:

- each panel query, with the dashboard's variables set (run, domain All or a selection), expanded by
  ``dashboards.macros`` over the scenario's range [start, start + duration + 1 h], answers without
  error, with a time column first for time series and at least one row;
- each alert rule's query, expanded for the rule (backend macros, its relative range and intervalMs,
  evaluated at the end of that range), gives labelled numbers; reduced and thresholded as the rule
  says, it fires on the scenario made to trigger it and stays quiet on scenarios/healthy.yaml.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboards import queries
from dashboards.expressions import Frame, Instance, evaluate_rule
from dashboards.macros import TimeRange, Variable, expand_alert_query, expand_panel_query, panel_interval_ms
from infra.clickhouse.reader import QueryResult
from producers.scenario import Scenario, load_scenario
from rollout.settings import Settings
from tests.support.play import play, scenario
from tests.support.worker import WorkerProcess, free_port

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "dashboards" / "generated"
RULES_FILE = ROOT / "infra" / "grafana" / "provisioning" / "alerting" / "rules.yaml"
CRAFTED = Path(__file__).resolve().parent / "scenarios"

PANEL_RUN = "demo"            # scenarios/default.yaml: every metric family has data
DRILL_DOWN_DOMAIN = "cad"     # default.yaml's regressing domain
DOMAIN_SELECTION = ["cad", "code"]

# Which run each rule must fire on (and the scenario range to evaluate it in).
TRIGGERS = {
    "rollout-domain-regression": "regression",
    "rollout-env-failure-spike": "surge",
    "rollout-policy-lag": "demo",
    "rollout-throughput-drop": "surge",
    "rollout-digest-mismatch": "demo",
}
QUIET_RUN = "healthy"


@dataclass(frozen=True)
class PlayedStack:
    """The module's stack once every scenario has been consumed."""

    worker: WorkerProcess
    ranges: dict[str, TimeRange]


def _range(first: Scenario, last: Scenario | None = None) -> TimeRange:
    """[start, start + duration + 1 h] of a scenario (or of a run played as two consecutive scenarios)."""
    end_of = last or first
    end = end_of.start + timedelta(seconds=end_of.duration) + timedelta(hours=1)
    return TimeRange(first.start, end)


@pytest.fixture(scope="module")
def stack(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlayedStack]:
    """One worker for the whole module, with every scenario played and consumed."""
    base = tmp_path_factory.mktemp("dashboard-queries")
    tag = uuid.uuid4().hex[:10]
    settings = Settings(
        data_dir=base / "data",
        kafka_bootstrap_servers_setting=kafka_bootstrap,
        topic_prefix=f"t{tag}",
        consumer_group=f"g{tag}",
        worker_web_port=free_port(),
        topic_partitions=4,
        sink_batch_size=2000,
        sink_batch_seconds=0.5,
    )
    worker = WorkerProcess(settings, base / "worker.log").start()
    try:
        default, regression, healthy = scenario("default"), scenario("regression"), scenario("healthy")
        baseline = load_scenario(CRAFTED / "surge-baseline.yaml")
        spike = load_scenario(CRAFTED / "surge-spike.yaml")
        published = 0
        for played in (default, regression, healthy, baseline, spike):
            published += play(settings, played).published
        worker.wait_consumed(published, timeout=900)
        ranges = {
            default.run_id: _range(default),
            regression.run_id: _range(regression),
            healthy.run_id: _range(healthy),
            baseline.run_id: _range(baseline, spike),
        }
        yield PlayedStack(worker, ranges)
    finally:
        worker.stop()


# -- the generated files, read at collection time ------------------------------------------------


def _dashboards() -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(GENERATED.glob("*.json"))}


def _panel_cases() -> list[Any]:
    cases = []
    for uid, board in _dashboards().items():
        for panel in board["panels"]:
            if panel["type"] != "row":
                cases.append(pytest.param(uid, panel, id=f"{uid}/{panel['title']}"))
    return cases


def _rules() -> dict[str, dict[str, Any]]:
    document = yaml.safe_load(RULES_FILE.read_text())
    return {rule["uid"]: rule for group in document["groups"] for rule in group["rules"]}


def _frame(result: QueryResult) -> Frame:
    return Frame(result.columns, result.types, result.rows)


def _is_time(clickhouse_type: str) -> bool:
    return clickhouse_type.removeprefix("Nullable(").startswith(("DateTime", "Date"))


def _is_number(clickhouse_type: str) -> bool:
    base = clickhouse_type.removeprefix("Nullable(").rstrip(")")
    return base.startswith(("UInt", "Int", "Float", "Decimal"))


# -- panels --------------------------------------------------------------------------------------


def _domains(stack: PlayedStack, run: str) -> list[str]:
    sql = expand_panel_query(queries.DOMAIN_OPTIONS, time_range=stack.ranges[run], interval_ms=60_000,
                             variables={"run": Variable.single(run)})
    return [str(row[0]) for row in stack.worker.query(sql).rows]


def test_variable_queries_list_the_runs_and_their_domains(stack: PlayedStack) -> None:
    runs_sql = expand_panel_query(queries.RUN_OPTIONS, time_range=stack.ranges[PANEL_RUN], interval_ms=60_000,
                                  variables={})
    assert [row[0] for row in stack.worker.query(runs_sql).rows] == sorted(stack.ranges)
    assert _domains(stack, PANEL_RUN) == ["cad", "code", "documents", "math"]


def _panel_variables(uid: str, stack: PlayedStack, selection: list[str] | None) -> dict[str, Variable]:
    options = _domains(stack, PANEL_RUN)
    if uid == "rollout-domain":
        domain = Variable.single(DRILL_DOWN_DOMAIN)
    elif selection is None:
        domain = Variable.all(options)
    else:
        domain = Variable.many(selection, options)
    return {"run": Variable.single(PANEL_RUN), "domain": domain}


def _panel_interval_ms(stack: PlayedStack, panel: dict[str, Any]) -> int:
    """The ``$__interval`` Grafana gives ``panel`` over the panel run's range."""
    return panel_interval_ms(stack.ranges[PANEL_RUN], max_data_points=int(panel.get("maxDataPoints") or 1000),
                             min_interval=panel.get("interval"))


def _run_panel(stack: PlayedStack, panel: dict[str, Any], variables: dict[str, Variable]) -> list[QueryResult]:
    time_range = stack.ranges[PANEL_RUN]
    interval = _panel_interval_ms(stack, panel)
    results = []
    for target in panel["targets"]:
        sql = expand_panel_query(target["rawSql"], time_range=time_range, interval_ms=interval, variables=variables)
        assert "$" not in sql.replace("$__", "") and "$__" not in sql, f"unexpanded macro or variable:\n{sql}"
        results.append(stack.worker.query(sql))
    return results


@pytest.mark.parametrize(("uid", "panel"), _panel_cases())
def test_panel_query_answers_with_the_expected_columns(stack: PlayedStack, uid: str, panel: dict[str, Any]) -> None:
    for selection in (None, DOMAIN_SELECTION):
        variables = _panel_variables(uid, stack, selection)
        for target, result in zip(panel["targets"], _run_panel(stack, panel, variables), strict=True):
            where = f"{panel['title']} [{target['refId']}] domains={selection or 'All'}"
            assert result.rows, f"{where}: no rows"
            assert any(_is_number(t) for t in result.types), f"{where}: no numeric column {result.types}"
            if target["format"] == 0:
                assert result.columns[0] == "time" and _is_time(result.types[0]), f"{where}: {result.columns}"
                times = [row[0] for row in result.rows]
                assert times == sorted(times), f"{where}: time series not sorted by time"
            # Columns the panel refers to (per-column units, sort) must exist in the result.
            named = {o["matcher"]["options"] for o in panel["fieldConfig"].get("overrides", [])
                     if o["matcher"]["id"] == "byName"}
            named |= {s["displayName"] for s in (panel.get("options") or {}).get("sortBy", [])}
            assert named <= set(result.columns), f"{where}: {named - set(result.columns)} not in {result.columns}"


def _epoch(value: datetime | str) -> int:
    """Seconds since the epoch of a time the worker's /sql gave (text in UTC, or a datetime)."""
    moment = datetime.fromisoformat(value) if isinstance(value, str) else value
    return int((moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp())


def test_budget_share_is_the_selected_domains_share_of_the_runs_sandbox_time(stack: PlayedStack) -> None:
    """Budget share against the same numbers computed here from v_budget's rows."""
    panel = next(p for p in _dashboards()["rollout-domain"]["panels"] if p["title"] == "Budget share")
    time_range = stack.ranges[PANEL_RUN]
    interval_s = _panel_interval_ms(stack, panel) // 1000
    rows = stack.worker.query(
        f"SELECT toUnixTimestamp(window_start), domain, sandbox_seconds, configured_weight FROM v_budget "
        f"WHERE run_id = '{PANEL_RUN}' AND window_start >= toDateTime({int(time_range.start.timestamp())}) "
        f"AND window_start <= toDateTime({int(time_range.end.timestamp())})").rows
    assert {str(r[1]) for r in rows} >= {DRILL_DOWN_DOMAIN, "code"}, "the run has no budget rows to compare"
    total: dict[int, float] = {}
    chosen: dict[int, float] = {}
    weight = 0.0  # the drill-down domain's configured weight: the highest its windows carry
    for start, domain, seconds, configured_weight in rows:
        bucket = int(start) // interval_s * interval_s
        total[bucket] = total.get(bucket, 0.0) + float(seconds)
        if domain == DRILL_DOWN_DOMAIN:
            chosen[bucket] = chosen.get(bucket, 0.0) + float(seconds)
            weight = max(weight, float(configured_weight))
    [result] = _run_panel(stack, panel, _panel_variables("rollout-domain", stack, None))
    assert result.columns == ["time", "sandbox_time_share", "configured_share"]
    got = {_epoch(row[0]): (row[1], row[2]) for row in result.rows}
    assert sorted(got) == sorted(total)
    for bucket, (share, configured) in got.items():
        expected = chosen.get(bucket, 0.0) / total[bucket] if total[bucket] > 0 else None
        assert share == pytest.approx(expected), bucket
        assert configured == pytest.approx(weight), bucket
    assert 0 < weight < 1


# -- alert rules ---------------------------------------------------------------------------------


def _evaluate(stack: PlayedStack, rule: dict[str, Any], run: str) -> tuple[list[Instance], dict[str, str]]:
    """The rule evaluated as Grafana would at the end of ``run``'s range."""
    now: datetime = stack.ranges[run].end
    results: dict[str, Frame] = {}
    expanded: dict[str, str] = {}
    for item in rule["data"]:
        if item["datasourceUid"] == "__expr__":
            continue
        span = item["relativeTimeRange"]
        sql = expand_alert_query(item["model"]["rawSql"], now=now, relative_from_s=span["from"],
                                 relative_to_s=span.get("to", 0), interval_ms=item["model"]["intervalMs"])
        expanded[item["refId"]] = sql
        results[item["refId"]] = _frame(stack.worker.query(sql))
    return evaluate_rule(rule, results), expanded


@pytest.mark.parametrize("uid", sorted(TRIGGERS))
def test_alert_query_gives_labelled_numbers(stack: PlayedStack, uid: str) -> None:
    rule = _rules()[uid]
    for run in sorted(stack.ranges):
        _, expanded = _evaluate(stack, rule, run)
        for sql in expanded.values():
            assert "$" not in sql
            result = stack.worker.query(sql)
            numeric = [c for c, t in zip(result.columns, result.types, strict=True) if _is_number(t)]
            labels = [c for c, t in zip(result.columns, result.types, strict=True) if not _is_number(t)]
            assert len(numeric) == 1, f"{uid}: one numeric column per row, got {result.columns}"
            assert {"run", "domain"} <= set(labels), f"{uid}: labels {labels}"
            assert all(row[result.columns.index(numeric[0])] is not None for row in result.rows)


@pytest.mark.parametrize(("uid", "run"), sorted(TRIGGERS.items()))
def test_alert_rule_fires_on_its_scenario(stack: PlayedStack, uid: str, run: str) -> None:
    instances, _ = _evaluate(stack, _rules()[uid], run)
    firing = [i for i in instances if i.state == "Alerting" and i.labels.get("run") == run]
    assert firing, f"{uid} did not fire on run {run}: {instances}"
    assert all(i.labels.get("domain") for i in firing)


@pytest.mark.parametrize("uid", sorted(TRIGGERS))
def test_alert_rule_stays_quiet_on_the_healthy_scenario(stack: PlayedStack, uid: str) -> None:
    instances, _ = _evaluate(stack, _rules()[uid], QUIET_RUN)
    noisy = [i for i in instances if i.state != "Normal" and i.labels.get("run", QUIET_RUN) == QUIET_RUN]
    assert noisy == [], f"{uid} is not quiet on {QUIET_RUN}: {noisy}"


def test_expected_alerts_for_the_known_scenarios(stack: PlayedStack) -> None:
    """The regression rule names the regressing domain, the surge rules name the crashing domain and class."""
    regression, _ = _evaluate(stack, _rules()["rollout-domain-regression"], "regression")
    assert {(i.labels["run"], i.labels["domain"]) for i in regression if i.state == "Alerting"} >= {
        ("regression", "cad")}
    spike, _ = _evaluate(stack, _rules()["rollout-env-failure-spike"], "surge")
    assert {(i.labels["domain"], i.labels["failure_class"]) for i in spike
            if i.state == "Alerting" and i.labels["run"] == "surge"} == {("code", "sandbox_crash")}
    drop, _ = _evaluate(stack, _rules()["rollout-throughput-drop"], "surge")
    assert {i.labels["domain"] for i in drop if i.state == "Alerting" and i.labels["run"] == "surge"} == {"code"}
