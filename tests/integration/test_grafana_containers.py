"""With a Docker engine: Kafka, a ClickHouse server and Grafana in containers, checked through Grafana itself.

Grafana starts with the ClickHouse plugin and this repository's provisioning mounted (data source,
dashboards, alert rules, contact point, policy). A local ``rollout worker`` fills ClickHouse from
scenarios/default.yaml. The test checks that provisioning loaded, the data source is healthy, every
dashboard and rule is present, and every panel query (variables interpolated as the browser would)
and every rule query answers through Grafana's ``/api/ds/query`` without error.

Without a Docker engine the module is skipped; the same queries still run on ClickHouse in
tests/e2e/test_dashboard_queries.py.
"""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboards.defaults import DATASOURCE_TYPE, DATASOURCE_UID
from dashboards.macros import TimeRange, Variable, interpolate_variables, panel_interval_ms
from rollout.settings import Settings
from tests.support.play import play, scenario
from tests.support.worker import WorkerProcess, free_port

ROOT = Path(__file__).resolve().parents[2]
PROVISIONING = ROOT / "infra" / "grafana" / "provisioning"
GENERATED = ROOT / "dashboards" / "generated"
USERS_XML = ROOT / "infra" / "grafana" / "clickhouse-users.xml"
COMPOSE = yaml.safe_load((ROOT / "infra" / "compose.yaml").read_text())
IMAGES = {name: COMPOSE["services"][name]["image"] for name in ("kafka", "clickhouse", "grafana")}
READER_PASSWORD = "grafana-reader-test"

NO_DOCKER = (
    "no Docker engine here: Grafana checks run only with Docker; every query is still executed against "
    "ClickHouse by tests/e2e/test_dashboard_queries.py"
)


def _docker_engine_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=5).ping()
    except Exception:  # no SDK, no socket, no permission, no answer: all mean "no engine to use"
        return False
    return True


pytestmark = [pytest.mark.integration, pytest.mark.skipif(not _docker_engine_answers(), reason=NO_DOCKER)]


@dataclass(frozen=True)
class Stack:
    """Grafana's API and the scenario that filled ClickHouse."""

    grafana: Any
    time_range: TimeRange
    run_id: str


def _wait_http(url: str, timeout: float, ok: Any = None) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                body = response.read()
                if ok is None or ok(body):
                    return
        except Exception as exc:  # not up yet
            last = exc
        time.sleep(1)
    raise AssertionError(f"{url} not ready after {timeout}s: {last}")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Kafka, ClickHouse and Grafana containers on one network, a local worker, the default scenario played."""
    from grafana_client import GrafanaApi
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.network import Network
    from testcontainers.core.waiting_utils import wait_for_logs

    base = tmp_path_factory.mktemp("grafana-containers")
    kafka_port = free_port()
    with Network() as network:
        kafka = (
            DockerContainer(IMAGES["kafka"])
            .with_network(network).with_network_aliases("kafka")
            .with_bind_ports(9094, kafka_port)
            .with_envs(
                KAFKA_NODE_ID="1",
                KAFKA_PROCESS_ROLES="broker,controller",
                KAFKA_LISTENERS="PLAINTEXT://:9092,CONTROLLER://:9093,HOST://:9094",
                KAFKA_ADVERTISED_LISTENERS=f"PLAINTEXT://kafka:9092,HOST://127.0.0.1:{kafka_port}",
                KAFKA_LISTENER_SECURITY_PROTOCOL_MAP="CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,HOST:PLAINTEXT",
                KAFKA_CONTROLLER_LISTENER_NAMES="CONTROLLER",
                KAFKA_CONTROLLER_QUORUM_VOTERS="1@kafka:9093",
                KAFKA_INTER_BROKER_LISTENER_NAME="PLAINTEXT",
                KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR="1",
                KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR="1",
                KAFKA_TRANSACTION_STATE_LOG_MIN_ISR="1",
                KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS="0",
            )
        )
        clickhouse = (
            DockerContainer(IMAGES["clickhouse"])
            .with_network(network).with_network_aliases("clickhouse")
            .with_exposed_ports(8123, 9000)
            .with_envs(CLICKHOUSE_USER="rollout", CLICKHOUSE_PASSWORD="rollout",
                       CLICKHOUSE_DEFAULT_ACCESS_MANAGEMENT="1", GRAFANA_CLICKHOUSE_PASSWORD=READER_PASSWORD)
            .with_volume_mapping(USERS_XML, "/etc/clickhouse-server/users.d/grafana.xml", "ro")
        )
        grafana = (
            DockerContainer(IMAGES["grafana"])
            .with_network(network)
            .with_exposed_ports(3000)
            .with_envs(
                TZ="UTC",
                GF_INSTALL_PLUGINS=COMPOSE["services"]["grafana"]["environment"]["GF_INSTALL_PLUGINS"],
                GF_SECURITY_ADMIN_PASSWORD="admin",
                GRAFANA_CLICKHOUSE_HOST="clickhouse", GRAFANA_CLICKHOUSE_PORT="9000",
                GRAFANA_CLICKHOUSE_PROTOCOL="native", GRAFANA_CLICKHOUSE_USER="grafana",
                GRAFANA_CLICKHOUSE_PASSWORD=READER_PASSWORD, GRAFANA_CLICKHOUSE_DATABASE="rollout",
                ROLLOUT_ALERT_WEBHOOK_URL="http://localhost:9/rollout-alerts",
            )
            .with_volume_mapping(PROVISIONING, "/etc/grafana/provisioning", "ro")
            .with_volume_mapping(GENERATED, "/var/lib/grafana/dashboards/rollout", "ro")
        )
        with kafka, clickhouse, grafana:
            wait_for_logs(kafka, "Kafka Server started", timeout=180)
            ch_host, ch_port = clickhouse.get_container_host_ip(), clickhouse.get_exposed_port(8123)
            _wait_http(f"http://{ch_host}:{ch_port}/ping", 120)
            tag = uuid.uuid4().hex[:10]
            settings = Settings(
                data_dir=base / "data",
                clickhouse_url_setting=f"http://rollout:rollout@{ch_host}:{ch_port}",
                kafka_bootstrap_servers_setting=f"127.0.0.1:{kafka_port}",
                topic_prefix=f"t{tag}", consumer_group=f"g{tag}", worker_web_port=free_port(),
                topic_partitions=4, sink_batch_size=2000, sink_batch_seconds=0.5,
            )
            worker = WorkerProcess(settings, base / "worker.log").start(timeout=180)
            try:
                default = scenario("default")
                worker.wait_consumed(play(settings, default).published, timeout=900)
            finally:
                worker.stop()
            g_host, g_port = grafana.get_container_host_ip(), grafana.get_exposed_port(3000)
            url = f"http://admin:admin@{g_host}:{g_port}"
            _wait_http(f"http://{g_host}:{g_port}/api/health", 300, lambda b: json.loads(b).get("database") == "ok")
            api = GrafanaApi.from_url(url, timeout=60)
            end = default.start + timedelta(seconds=default.duration) + timedelta(hours=1)
            yield Stack(api, TimeRange(default.start, end), default.run_id)


def _dashboards() -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(GENERATED.glob("*.json"))}


def _rules() -> list[dict[str, Any]]:
    document = yaml.safe_load((PROVISIONING / "alerting" / "rules.yaml").read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def _query(stack: Stack, model: dict[str, Any], time_range: TimeRange, interval_ms: int) -> dict[str, Any]:
    body = {
        "queries": [{**model, "datasource": {"type": DATASOURCE_TYPE, "uid": DATASOURCE_UID},
                     "intervalMs": interval_ms, "maxDataPoints": 1000}],
        "from": str(int(time_range.start.timestamp() * 1000)),
        "to": str(int(time_range.end.timestamp() * 1000)),
    }
    answer: dict[str, Any] = stack.grafana.client.POST("/ds/query", json=body)
    return answer["results"][model["refId"]]


def test_provisioned_datasource_is_healthy(stack: Stack) -> None:
    health = stack.grafana.client.GET(f"/datasources/uid/{DATASOURCE_UID}/health")
    assert health["status"] == "OK", health


def test_every_dashboard_is_provisioned_in_the_rollout_folder(stack: Stack) -> None:
    for uid in _dashboards():
        found = stack.grafana.dashboard.get_dashboard(uid)
        assert found["meta"]["provisioned"] is True
        assert found["meta"]["folderUid"] == "rollout"


def test_every_alert_rule_contact_point_and_policy_is_provisioned(stack: Stack) -> None:
    rules = {r["uid"]: r for r in stack.grafana.alertingprovisioning.get_alertrules_all()}
    for rule in _rules():
        assert rule["uid"] in rules
        assert rules[rule["uid"]]["provenance"] == "file"
    points = stack.grafana.alertingprovisioning.get_contactpoints(name="rollout-webhook")
    assert points and points[0]["type"] == "webhook"
    assert stack.grafana.alertingprovisioning.get_notification_policy_tree()["receiver"] == "rollout-webhook"


def test_every_panel_query_answers_through_grafana(stack: Stack) -> None:
    domains = ["cad", "code", "documents", "math"]
    for uid, board in _dashboards().items():
        domain = Variable.single("cad") if uid == "rollout-domain" else Variable.all(domains)
        variables = {"run": Variable.single(stack.run_id), "domain": domain}
        for panel in board["panels"]:
            if panel["type"] == "row":
                continue
            interval = panel_interval_ms(stack.time_range, max_data_points=int(panel.get("maxDataPoints") or 1000),
                                         min_interval=panel.get("interval"))
            for target in panel["targets"]:
                model = {**target, "rawSql": interpolate_variables(target["rawSql"], variables)}
                result = _query(stack, model, stack.time_range, interval)
                where = f"{uid} / {panel['title']}"
                assert result.get("status", 200) == 200 and not result.get("error"), (where, result)
                frames = result.get("frames") or []
                assert frames and any(f["data"]["values"] and f["data"]["values"][0] for f in frames), where


def test_every_alert_rule_query_answers_through_grafana(stack: Stack) -> None:
    for rule in _rules():
        query = rule["data"][0]
        span = query["relativeTimeRange"]
        now = stack.time_range.end
        time_range = TimeRange(now - timedelta(seconds=span["from"]), now - timedelta(seconds=span["to"]))
        result = _query(stack, query["model"], time_range, query["model"]["intervalMs"])
        assert result.get("status", 200) == 200 and not result.get("error"), (rule["uid"], result)
