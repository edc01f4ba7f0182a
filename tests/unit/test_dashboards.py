"""Dashboards, alert rules and provisioning as code: committed files match a fresh build and pass the linters."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from grafana_foundation_sdk.models import alerting as alerting_model
from grafana_foundation_sdk.models import dashboard as dashboard_model
from typer.testing import CliRunner

from dashboards import alerts, boards, build, lint, queries
from dashboards.alerts import to_plain
from dashboards.defaults import DATASOURCE_TYPE, DATASOURCE_UID, PLUGIN_VERSION

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "dashboards" / "generated"
PROVISIONING = ROOT / "infra" / "grafana" / "provisioning"
EXPECTED_UIDS = {"rollout-overview", "rollout-domain", "rollout-environment", "rollout-verifier"}


def _committed_dashboards() -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(GENERATED.glob("*.json"))}


def _rules() -> list[dict[str, Any]]:
    document = yaml.safe_load((PROVISIONING / "alerting" / "rules.yaml").read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def _panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in board["panels"] if p["type"] != "row"]


# -- drift ---------------------------------------------------------------------------------------


def test_committed_files_match_a_fresh_build() -> None:
    differences = build.drift(ROOT)
    assert not differences, (
        "generated Grafana files are out of date; run `python -m dashboards` (or `rollout grafana build`):\n"
        + differences.describe()
    )


def test_build_writes_everything_and_reports_then_removes_stale_files(tmp_path: Path) -> None:
    first = build.write(tmp_path)
    assert set(first.missing) == set(build.render())
    (tmp_path / "dashboards" / "generated" / "old-board.json").write_text("{}")
    (tmp_path / "dashboards" / "generated" / "rollout-overview.json").write_text("{}")
    second = build.write(tmp_path)
    assert second.stale == ("dashboards/generated/old-board.json",)
    assert second.changed == ("dashboards/generated/rollout-overview.json",)
    assert not build.drift(tmp_path)


def test_builds_are_byte_for_byte_reproducible() -> None:
    assert build.render() == build.render()


def test_cli_build_check_passes_on_this_checkout_and_fails_on_drift(tmp_path: Path) -> None:
    import typer

    from rollout.commands import grafana

    app = typer.Typer()
    grafana.register(app)
    runner = CliRunner()
    assert runner.invoke(app, ["grafana", "build", "--check"]).exit_code == 0
    missing = runner.invoke(app, ["grafana", "build", "--check", "--root", str(tmp_path)])
    assert missing.exit_code == 1
    assert "out of date" in missing.output + (missing.stderr or "")
    assert runner.invoke(app, ["grafana", "build", "--root", str(tmp_path)]).exit_code == 0
    assert runner.invoke(app, ["grafana", "build", "--check", "--root", str(tmp_path)]).exit_code == 0


# -- dashboards ----------------------------------------------------------------------------------


def test_the_four_dashboards_exist_with_stable_uids() -> None:
    committed = _committed_dashboards()
    assert set(committed) == EXPECTED_UIDS
    assert {b.uid for b in boards.all_dashboards()} == EXPECTED_UIDS
    for uid, board in committed.items():
        assert board["uid"] == uid


@pytest.mark.parametrize("uid", sorted(EXPECTED_UIDS))
def test_dashboard_passes_the_linter(uid: str) -> None:
    assert lint.lint_dashboard(_committed_dashboards()[uid]) == []


@pytest.mark.parametrize("uid", sorted(EXPECTED_UIDS))
def test_dashboard_parses_back_through_the_sdk_unchanged(uid: str) -> None:
    board = _committed_dashboards()[uid]
    assert to_plain(dashboard_model.Dashboard.from_json(board)) == board


def test_every_panel_has_the_clickhouse_query_model() -> None:
    for board in _committed_dashboards().values():
        for panel in _panels(board):
            assert panel["title"] and panel["description"] and panel["fieldConfig"]["defaults"]["unit"]
            assert panel["targets"], panel["title"]
            for target in panel["targets"]:
                assert target["datasource"] == {"type": DATASOURCE_TYPE, "uid": "${datasource}"}
                assert target["editorType"] == "sql" and target["pluginVersion"] == PLUGIN_VERSION
                assert target["format"] in (0, 1) and type(target["format"]) is int
                assert target["queryType"] == ("timeseries" if target["format"] == 0 else "table")
                assert (panel["type"] == "timeseries") == (target["format"] == 0)
                assert "$__timeFilter(" in target["rawSql"] or "FROM v_alerts" in target["rawSql"]


def test_variables_datasource_run_and_domain() -> None:
    for uid, board in _committed_dashboards().items():
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert list(variables) == ["datasource", "run", "domain"]
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == DATASOURCE_TYPE
        assert variables["datasource"]["current"]["value"] == DATASOURCE_UID
        assert variables["run"]["multi"] is False
        drill_down = uid == "rollout-domain"
        assert variables["domain"]["multi"] is not drill_down
        assert variables["domain"]["includeAll"] is not drill_down


def test_no_placeholder_data_sources_anywhere() -> None:
    for path in [*GENERATED.glob("*.json"), *PROVISIONING.rglob("*.yaml")]:
        text = path.read_text()
        assert "${DS_" not in text and "__inputs" not in text, path


def test_linter_catches_what_it_should() -> None:
    board = json.loads(json.dumps(_committed_dashboards()["rollout-overview"]))
    panel = _panels(board)[0]
    del panel["description"]
    panel["fieldConfig"]["defaults"].pop("unit")
    panel["targets"][0]["format"] = "time_series"
    panel["targets"][0]["rawSql"] = "SELECT * FROM m_throughput WHERE 1"
    _panels(board)[1]["targets"][0]["rawSql"] = "SELECT count() FROM v_trajectories WHERE $__timeFilter(finished_at)"
    board["templating"]["list"] = board["templating"]["list"][1:]
    problems = "\n".join(lint.lint_dashboard(board))
    for expected in ("no description", "no unit", "format must be the number 0", "reads 'm_throughput'",
                     "datasource variable", "$__timeFilter", "run variable", "$__conditionalAll",
                     "reads v_trajectories"):
        assert expected in problems, expected


def test_queries_read_contract_views_only() -> None:
    for name in dir(queries):
        sql = getattr(queries, name)
        if name.isupper() and isinstance(sql, str) and "SELECT" in sql:
            assert lint.sources(sql), name
            assert all(s.startswith("v_") for s in lint.sources(sql)), (name, lint.sources(sql))


# -- alert rules ---------------------------------------------------------------------------------


def test_rules_file_has_the_file_provisioning_shape() -> None:
    document = yaml.safe_load((PROVISIONING / "alerting" / "rules.yaml").read_text())
    assert document["apiVersion"] == 1
    (group,) = document["groups"]
    assert set(group) == {"orgId", "name", "folder", "interval", "rules"}
    assert group["interval"] == "1m"
    assert {r["uid"] for r in group["rules"]} == {
        "rollout-domain-regression", "rollout-env-failure-spike", "rollout-policy-lag",
        "rollout-throughput-drop", "rollout-digest-mismatch",
    }
    for rule in group["rules"]:
        assert {"uid", "title", "condition", "data", "for", "noDataState", "execErrState", "labels",
                "annotations"} <= set(rule)
        assert "folderUID" not in rule and "ruleGroup" not in rule  # HTTP API fields do not belong here


def test_rules_pass_the_linter() -> None:
    document = yaml.safe_load((PROVISIONING / "alerting" / "rules.yaml").read_text())
    assert lint.lint_rules_file(document) == []


def test_rule_queries_are_backend_only_with_an_interval_and_gt_lt_thresholds() -> None:
    for rule in _rules():
        query, reduce, threshold = rule["data"]
        assert query["datasourceUid"] == DATASOURCE_UID
        assert query["model"]["intervalMs"] == 60_000 and query["model"]["format"] == 1
        assert "${" not in query["model"]["rawSql"] and "$__conditionalAll" not in query["model"]["rawSql"]
        assert reduce["datasourceUid"] == "__expr__" and reduce["model"]["type"] == "reduce"
        assert threshold["model"]["type"] == "threshold" and rule["condition"] == threshold["refId"]
        assert threshold["model"]["conditions"][0]["evaluator"]["type"] in ("gt", "lt")
        assert set(rule["labels"]) == {"severity", "run", "domain"}
        assert rule["annotations"]["summary"] and "/d/rollout-domain" in rule["annotations"]["dashboard_url"]
        assert "$" not in json.dumps(rule["labels"]) + json.dumps(rule["annotations"])


def test_file_rules_parse_through_the_sdk_models() -> None:
    for rule in _rules():
        parsed = to_plain(alerting_model.Rule.from_json(rule))
        for key in ("uid", "title", "condition", "for", "noDataState", "execErrState", "labels", "annotations"):
            assert parsed[key] == rule[key]
        assert parsed["data"] == rule["data"]


def test_http_rule_group_has_the_api_shape() -> None:
    group = alerts.api_rule_group()
    assert group["interval"] == 60 and group["folderUid"] == "rollout" and group["title"] == "rollout"
    for rule in group["rules"]:
        assert rule["folderUID"] == "rollout" and rule["ruleGroup"] == "rollout" and rule["orgID"] == 1
    assert to_plain(alerting_model.RuleGroup.from_json(group)) == group
    assert [r["uid"] for r in group["rules"]] == [r["uid"] for r in _rules()]


def test_contact_point_and_policy_files() -> None:
    points = yaml.safe_load((PROVISIONING / "alerting" / "contact-points.yaml").read_text())
    (point,) = points["contactPoints"]
    (receiver,) = point["receivers"]
    assert receiver["type"] == "webhook" and receiver["settings"]["url"] == "$ROLLOUT_ALERT_WEBHOOK_URL"
    policies = yaml.safe_load((PROVISIONING / "alerting" / "policies.yaml").read_text())
    (policy,) = policies["policies"]
    assert policy["receiver"] == point["name"] and {"run", "domain"} <= set(policy["group_by"])


# -- provisioning --------------------------------------------------------------------------------


def test_datasource_has_a_fixed_uid_and_reads_its_connection_from_the_environment() -> None:
    document = yaml.safe_load((PROVISIONING / "datasources" / "clickhouse.yaml").read_text())
    (source,) = document["datasources"]
    assert source["uid"] == DATASOURCE_UID and source["type"] == DATASOURCE_TYPE
    assert source["jsonData"]["host"] == "$GRAFANA_CLICKHOUSE_HOST"
    assert source["jsonData"]["username"] == "$GRAFANA_CLICKHOUSE_USER"
    assert source["secureJsonData"]["password"] == "$GRAFANA_CLICKHOUSE_PASSWORD"
    assert source["jsonData"]["protocol"] == "$GRAFANA_CLICKHOUSE_PROTOCOL"


def test_dashboard_provider_points_at_the_generated_dashboards() -> None:
    document = yaml.safe_load((PROVISIONING / "dashboards" / "provider.yaml").read_text())
    (provider,) = document["providers"]
    assert provider["type"] == "file" and provider["folder"] == "Rollout"
    assert provider["allowUiUpdates"] is False
    compose = yaml.safe_load((ROOT / "infra" / "compose.yaml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    assert any(m.endswith(":" + provider["options"]["path"] + ":ro") for m in mounts), mounts


def test_compose_runs_the_whole_stack() -> None:
    compose = yaml.safe_load((ROOT / "infra" / "compose.yaml").read_text())
    services = compose["services"]
    assert {"kafka", "clickhouse", "grafana", "worker", "simulator"} <= set(services)
    assert services["kafka"]["image"].startswith("apache/kafka:")
    grafana = services["grafana"]
    assert "grafana-clickhouse-datasource" in grafana["environment"]["GF_INSTALL_PLUGINS"]
    assert any(":/etc/grafana/provisioning" in m for m in grafana["volumes"])
    for name, run in (("worker", "rollout worker"), ("simulator", "rollout simulate")):
        command = " ".join(services[name]["command"])
        assert services[name]["image"].startswith("python:")
        assert "pip install -q -e . -c constraints.txt" in command and run in command
