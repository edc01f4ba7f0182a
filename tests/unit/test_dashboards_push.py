"""``rollout grafana push`` over real HTTP: clear one-line errors, and idempotent create-or-update.

A closed loopback port, a tiny server answering 401, and a small in-memory Grafana that speaks the
few HTTP API endpoints a push uses (no mocks of the client library).
"""

from __future__ import annotations

import json
import re
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import typer
from typer.testing import CliRunner

from dashboards.exceptions import GrafanaAuthError, GrafanaRejected, GrafanaUnreachable
from dashboards.push import ClickHouseConnection, push, shown_url
from rollout.commands import grafana as grafana_command
from rollout.errors import ConfigurationError

TOKEN = "service-account-token"
VIEWER = "viewer-token"
CLICKHOUSE = ClickHouseConnection(host="clickhouse", port=9000, protocol="native", username="grafana",
                                  password="reader-secret", database="rollout")


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed again when the block ends: nothing listens there


class FakeGrafana:
    """The HTTP API endpoints a push uses, in memory; every request is recorded."""

    def __init__(self) -> None:
        self.folders: dict[str, dict[str, Any]] = {}
        self.datasources: dict[str, dict[str, Any]] = {}
        self.dashboards: dict[str, dict[str, Any]] = {}
        self.contact_points: dict[str, dict[str, Any]] = {}
        self.policy: dict[str, Any] | None = None
        self.rule_groups: dict[tuple[str, str], dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def handle(self, method: str, path: str, query: dict[str, list[str]], auth: str,
               body: Any) -> tuple[int, Any]:
        """Answer one request: (status, JSON body)."""
        with self.lock:
            self.requests.append((method, path))
            if auth not in (f"Bearer {TOKEN}", f"Bearer {VIEWER}"):
                return 401, {"message": "Unauthorized"}
            if auth == f"Bearer {VIEWER}" and method != "GET":
                return 403, {"message": "You'll need additional permissions to perform this action."}
            return self._route(method, path, query, body)

    def _route(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        if path == "/api/frontend/settings":
            return 200, {"buildInfo": {"version": "12.0.2"}}
        if m := re.fullmatch(r"/api/folders/([\w-]+)", path):
            folder = self.folders.get(m.group(1))
            return (200, folder) if folder else (404, {"message": "folder not found"})
        if path == "/api/folders" and method == "POST":
            self.folders[body["uid"]] = {"uid": body["uid"], "title": body["title"]}
            return 200, self.folders[body["uid"]]
        if m := re.fullmatch(r"/api/datasources/uid/([\w-]+)", path):
            uid = m.group(1)
            if method == "GET":
                found = self.datasources.get(uid)
                return (200, {**found, "id": 1}) if found else (404, {"message": "Data source not found"})
            self.datasources[uid] = body
            return 200, {"message": "Datasource updated"}
        if path == "/api/datasources" and method == "POST":
            self.datasources[body["uid"]] = body
            return 200, {"message": "Datasource added"}
        if m := re.fullmatch(r"/api/dashboards/uid/([\w-]+)", path):
            found = self.dashboards.get(m.group(1))
            return (200, found) if found else (404, {"message": "Dashboard not found"})
        if path == "/api/dashboards/db" and method == "POST":
            board = {k: v for k, v in body["dashboard"].items() if k != "id"}
            previous = self.dashboards.get(board["uid"])
            version = (previous["dashboard"]["version"] + 1) if previous else 1
            self.dashboards[board["uid"]] = {"dashboard": {**board, "id": 7, "version": version},
                                             "meta": {"folderUid": body["folderUid"]}}
            return 200, {"status": "success", "uid": board["uid"], "version": version}
        if path == "/api/v1/provisioning/contact-points":
            if method == "GET":
                name = query.get("name", [None])[0]
                return 200, [p for p in self.contact_points.values() if name in (None, p["name"])]
            self.contact_points[body["uid"]] = body
            return 202, body
        if m := re.fullmatch(r"/api/v1/provisioning/contact-points/([\w-]+)", path):
            self.contact_points[m.group(1)] = body
            return 202, {"message": "contactpoint updated"}
        if path == "/api/v1/provisioning/policies" and method == "PUT":
            self.policy = body
            return 202, {"message": "policies updated"}
        if m := re.fullmatch(r"/api/v1/provisioning/folder/([\w-]+)/rule-groups/([\w-]+)", path):
            key = (m.group(1), m.group(2))
            if method == "GET":
                found = self.rule_groups.get(key)
                return (200, found) if found else (404, {"message": "rule group not found"})
            if key[0] not in self.folders:
                return 400, {"message": "folder does not exist"}
            self.rule_groups[key] = body
            return 200, body
        return 404, {"message": f"no route {method} {path}"}


def _serve(handler_for: Any) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            parts = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            status, payload = handler_for(self.command, parts.path, parse_qs(parts.query),
                                          self.headers.get("Authorization", ""), body)
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = _answer

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def fake() -> Iterator[tuple[str, FakeGrafana]]:
    grafana = FakeGrafana()
    for url in _serve(grafana.handle):
        yield url, grafana


@pytest.fixture
def always_401() -> Iterator[str]:
    yield from _serve(lambda *_: (401, {"message": "Unauthorized"}))


def _cli(*args: str) -> Any:
    app = typer.Typer()
    grafana_command.register(app)
    return CliRunner().invoke(app, ["grafana", "push", *args])


# -- errors --------------------------------------------------------------------------------------


def test_closed_port_is_a_one_line_connection_error() -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    refused = r"cannot reach Grafana at http://127\.0\.0\.1:\d+: Connection refused"
    with pytest.raises(GrafanaUnreachable, match=refused):
        push(url=url, token=TOKEN, clickhouse=CLICKHOUSE, timeout=2)
    result = _cli("--url", url, "--token", TOKEN, "--timeout", "2")
    assert result.exit_code == 1
    text = (result.stderr or result.output).strip()
    assert text.startswith("error: cannot reach Grafana at") and "Connection refused" in text
    assert "\n" not in text and "Traceback" not in result.output


def test_401_is_a_one_line_credentials_error_that_hides_the_password(always_401: str) -> None:
    with pytest.raises(GrafanaAuthError, match="refused the credentials .401 Unauthorized.*--token"):
        push(url=always_401, token="wrong", clickhouse=CLICKHOUSE)
    with_password = always_401.replace("http://", "http://admin:hunter2@")
    result = _cli("--url", with_password)
    text = (result.stderr or result.output).strip()
    assert result.exit_code == 1 and "\n" not in text
    assert "admin:***@" in text and "hunter2" not in text


def test_403_says_which_role_is_missing(fake: tuple[str, FakeGrafana]) -> None:
    url, _ = fake
    with pytest.raises(GrafanaAuthError, match=r"denied permission while creating the folder \(403 Forbidden\).*Admin"):
        push(url=url, token=VIEWER, clickhouse=CLICKHOUSE)


def test_a_rejected_request_names_the_step_and_grafanas_message(fake: tuple[str, FakeGrafana]) -> None:
    url, grafana = fake
    grafana.folders["rollout"] = {"uid": "rollout", "title": "Rollout"}
    real_route = grafana._route

    def refuse_rules(method: str, path: str, query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        if "rule-groups" in path and method == "PUT":
            return 400, {"message": "invalid alert rule: condition C does not exist"}
        return real_route(method, path, query, body)

    grafana._route = refuse_rules  # type: ignore[method-assign]
    with pytest.raises(GrafanaRejected, match="while saving the alert rule group .400.: invalid alert rule"):
        push(url=url, token=TOKEN, clickhouse=CLICKHOUSE)


def test_a_url_without_scheme_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="--url must look like"):
        push(url="localhost:3000", token=TOKEN, clickhouse=CLICKHOUSE)
    assert shown_url("https://u:p@g.example:3000/x") == "https://u:***@g.example:3000/x"


# -- idempotent create or update -----------------------------------------------------------------


def test_first_push_creates_everything_with_the_api_shapes(fake: tuple[str, FakeGrafana]) -> None:
    url, grafana = fake
    report = push(url=url, token=TOKEN, clickhouse=CLICKHOUSE, webhook_url="http://hooks.example/rollout")
    actions = {(kind, action) for kind, _, action in report.changes}
    assert report.grafana_version == "12.0.2"
    assert {("folder", "created"), ("data source", "created"), ("dashboard", "created"),
            ("contact point", "created"), ("alert rule", "created")} <= actions
    assert grafana.folders == {"rollout": {"uid": "rollout", "title": "Rollout"}}

    source = grafana.datasources["rollout-clickhouse"]
    assert source["type"] == "grafana-clickhouse-datasource"
    assert source["jsonData"]["host"] == "clickhouse" and source["jsonData"]["username"] == "grafana"
    assert source["secureJsonData"] == {"password": "reader-secret"}

    assert set(grafana.dashboards) == {"rollout-overview", "rollout-domain", "rollout-environment",
                                       "rollout-verifier"}
    assert all(d["meta"]["folderUid"] == "rollout" for d in grafana.dashboards.values())

    group = grafana.rule_groups[("rollout", "rollout")]
    assert group["interval"] == 60 and group["folderUid"] == "rollout"
    assert len(group["rules"]) == 5
    for rule in group["rules"]:
        assert rule["folderUID"] == "rollout" and rule["ruleGroup"] == "rollout"
        assert rule["data"][0]["model"]["intervalMs"] == 60_000

    point = grafana.contact_points["rollout-webhook"]
    assert point["type"] == "webhook" and point["settings"]["url"] == "http://hooks.example/rollout"
    assert grafana.policy is not None and grafana.policy["receiver"] == "rollout-webhook"


def test_second_push_updates_in_place_and_leaves_identical_dashboards_alone(fake: tuple[str, FakeGrafana]) -> None:
    url, grafana = fake
    push(url=url, token=TOKEN, clickhouse=CLICKHOUSE, webhook_url="http://hooks.example/rollout")
    versions = {uid: d["dashboard"]["version"] for uid, d in grafana.dashboards.items()}
    grafana.requests.clear()

    report = push(url=url, token=TOKEN, clickhouse=CLICKHOUSE, webhook_url="http://hooks.example/rollout")
    actions = {kind: action for kind, _, action in report.changes}
    assert actions["folder"] == "unchanged" and actions["dashboard"] == "unchanged"
    assert actions["data source"] == "updated" and actions["alert rule"] == "updated"
    assert actions["contact point"] == "updated"
    assert {uid: d["dashboard"]["version"] for uid, d in grafana.dashboards.items()} == versions
    assert ("POST", "/api/folders") not in grafana.requests
    assert ("POST", "/api/dashboards/db") not in grafana.requests
    assert ("POST", "/api/v1/provisioning/contact-points") not in grafana.requests
    assert len(grafana.folders) == 1 and len(grafana.datasources) == 1 and len(grafana.contact_points) == 1


def test_without_a_webhook_the_notification_policy_is_left_alone(fake: tuple[str, FakeGrafana]) -> None:
    url, grafana = fake
    push(url=url, token=TOKEN, clickhouse=CLICKHOUSE)
    assert grafana.policy is None and grafana.contact_points == {}
    assert ("rollout", "rollout") in grafana.rule_groups


def test_cli_push_prints_what_it_did(fake: tuple[str, FakeGrafana]) -> None:
    url, _ = fake
    result = _cli("--url", url, "--token", TOKEN, "--clickhouse-password", "x")
    assert result.exit_code == 0, result.output
    assert "Rollout overview" in result.output and "created" in result.output
