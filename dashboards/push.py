"""Create or update the folder, data source, dashboards and alert rules on a running Grafana (HTTP API).

Idempotent: every object has a fixed uid, so a second push updates in place (or leaves unchanged
what already matches). Errors become one-line :mod:`dashboards.exceptions` errors that say what
to fix: Grafana unreachable, credentials refused, permission missing, request rejected.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit, urlunsplit

import niquests
from grafana_client.api import GrafanaApi
from grafana_client.client import (
    GrafanaClientError,
    GrafanaException,
    GrafanaServerError,
    GrafanaTimeoutError,
    GrafanaUnauthorizedError,
)

from dashboards import alerts, boards, provisioning
from dashboards.alerts import to_plain
from dashboards.defaults import (
    ALERT_GROUP,
    CONTACT_POINT,
    CONTACT_POINT_UID,
    DATASOURCE_UID,
    FOLDER_TITLE,
    FOLDER_UID,
)
from dashboards.exceptions import GrafanaAuthError, GrafanaRejected, GrafanaUnreachable
from rollout.errors import ConfigurationError

Action = Literal["created", "updated", "unchanged"]
T = TypeVar("T")

PUSH_MESSAGE = "rollout grafana push"


@dataclass(frozen=True, slots=True)
class ClickHouseConnection:
    """How Grafana reaches ClickHouse (as seen from the Grafana server), with a read-only user."""

    host: str
    port: int
    protocol: Literal["native", "http"]
    username: str
    password: str
    database: str
    secure: bool = False


@dataclass(slots=True)
class PushReport:
    """What a push did to each object: (kind, name, action)."""

    grafana_version: str = ""
    changes: list[tuple[str, str, Action]] = field(default_factory=list)

    def add(self, kind: str, name: str, action: Action) -> None:
        """Record one object's outcome."""
        self.changes.append((kind, name, action))


def shown_url(url: str) -> str:
    """The URL without a password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _reason(exc: BaseException) -> str:
    """A short reason for a connection problem: the OS error when there is one."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.strerror:
            return str(seen.strerror)
        seen = seen.__cause__ or seen.__context__
    text = str(exc)
    match = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    if match:
        return match.group(1).strip()
    for hint in ("Connection refused", "timed out", "Name or service not known", "certificate verify failed"):
        if hint.lower() in text.lower():
            return hint
    first = " ".join(text.split())
    return first[:200] or type(exc).__name__


class Grafana:
    """A thin, error-mapping wrapper over grafana-client for the calls a push makes."""

    def __init__(self, url: str, *, token: str | None = None, timeout: float = 10.0) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigurationError(f"--url must look like http://host:3000 (got {url!r})")
        self.url = url
        self.shown = shown_url(url)
        credential: str | tuple[str, str] | None = token or None
        self.api: Any = GrafanaApi.from_url(url, credential=credential, timeout=timeout)

    def call(self, doing: str, fn: Callable[[], T]) -> T:
        """Run one API call; vendor errors become this project's errors with one clear line."""
        try:
            return fn()
        except GrafanaUnauthorizedError as exc:
            raise GrafanaAuthError(
                f"Grafana at {self.shown} refused the credentials (401 Unauthorized) while {doing}: pass "
                "--token with a service account token (Admin role), or put user:password in the URL"
            ) from exc
        except GrafanaTimeoutError as exc:
            raise GrafanaUnreachable(
                f"Grafana at {self.shown} did not answer in time while {doing}: is it up and reachable?"
            ) from exc
        except GrafanaServerError as exc:
            raise GrafanaRejected(
                f"Grafana at {self.shown} failed while {doing} ({exc.status_code}): {_message(exc)}"
            ) from exc
        except GrafanaClientError as exc:
            if exc.status_code == 403:
                raise GrafanaAuthError(
                    f"Grafana at {self.shown} denied permission while {doing} (403 Forbidden): the token "
                    "or user needs the Admin role (folders, data sources and alerting provisioning)"
                ) from exc
            raise GrafanaRejected(
                f"Grafana at {self.shown} rejected the request while {doing} ({exc.status_code}): {_message(exc)}"
            ) from exc
        except GrafanaException as exc:
            raise GrafanaUnreachable(f"cannot reach Grafana at {self.shown}: {_reason(exc)}") from exc
        except (niquests.exceptions.InvalidURL, niquests.exceptions.MissingSchema) as exc:
            raise ConfigurationError(f"--url {self.shown!r} is not a valid URL: {_reason(exc)}") from exc
        except (niquests.exceptions.RequestException, OSError) as exc:
            raise GrafanaUnreachable(
                f"cannot reach Grafana at {self.shown}: {_reason(exc)}; start Grafana or fix --url"
            ) from exc

    def get_or_none(self, doing: str, fn: Callable[[], T]) -> T | None:
        """Like :meth:`call`, but a 404 means "not there yet": None."""
        try:
            return self.call(doing, fn)
        except GrafanaRejected as exc:
            cause = exc.__cause__
            if isinstance(cause, GrafanaClientError) and cause.status_code == 404:
                return None
            raise


def _message(exc: GrafanaException) -> str:
    response = exc.response
    if isinstance(response, dict) and response.get("message"):
        text = str(response["message"])
    else:
        text = str(exc.message or response or "")
    return " ".join(text.split())[:300]


def _strip(board: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in board.items() if k not in ("id", "version")}


def push(*, url: str, token: str | None, clickhouse: ClickHouseConnection, webhook_url: str | None = None,
         timeout: float = 10.0) -> PushReport:
    """Create or update everything on the Grafana at ``url``; the contact point and policy only with a webhook.

    The notification policy replaces Grafana's whole policy tree, so it is pushed only when a
    webhook URL is given (a team may route alerts its own way).
    """
    grafana = Grafana(url, token=token, timeout=timeout)
    api = grafana.api
    report = PushReport()
    info = grafana.call("checking its health", lambda: api.health.check())
    report.grafana_version = str((info or {}).get("version", "")) if isinstance(info, dict) else ""

    _push_folder(grafana, report)
    _push_datasource(grafana, report, clickhouse)
    for board in boards.all_dashboards():
        _push_dashboard(grafana, report, to_plain(board))
    if webhook_url:
        _push_contact_point(grafana, report, webhook_url)
        grafana.call("setting the notification policy",
                     lambda: api.alertingprovisioning.set_notification_policy_tree(alerts.notification_policy()))
        report.add("notification policy", CONTACT_POINT, "updated")
    _push_rules(grafana, report)
    return report


def _push_folder(grafana: Grafana, report: PushReport) -> None:
    api = grafana.api
    folder = grafana.get_or_none("reading the folder", lambda: api.folder.get_folder(FOLDER_UID))
    if folder is None:
        grafana.call("creating the folder", lambda: api.folder.create_folder(FOLDER_TITLE, uid=FOLDER_UID))
        report.add("folder", FOLDER_TITLE, "created")
    elif folder.get("title") != FOLDER_TITLE:
        grafana.call("renaming the folder",
                     lambda: api.folder.update_folder(FOLDER_UID, title=FOLDER_TITLE, overwrite=True))
        report.add("folder", FOLDER_TITLE, "updated")
    else:
        report.add("folder", FOLDER_TITLE, "unchanged")


def _push_datasource(grafana: Grafana, report: PushReport, clickhouse: ClickHouseConnection) -> None:
    api = grafana.api
    json_data = provisioning.datasource_settings(
        host=clickhouse.host, port=clickhouse.port, protocol=clickhouse.protocol,
        username=clickhouse.username, database=clickhouse.database, secure=clickhouse.secure,
    )
    body = {**provisioning.datasource(json_data), "secureJsonData": {"password": clickhouse.password}}
    existing = grafana.get_or_none("reading the data source",
                                   lambda: api.datasource.get_datasource_by_uid(DATASOURCE_UID))
    if existing is None:
        grafana.call("creating the data source", lambda: api.datasource.create_datasource(body))
        report.add("data source", body["name"], "created")
    else:
        grafana.call("updating the data source",
                     lambda: api.datasource.update_datasource_by_uid(DATASOURCE_UID, body))
        report.add("data source", body["name"], "updated")


def _push_dashboard(grafana: Grafana, report: PushReport, board: dict[str, Any]) -> None:
    api = grafana.api
    uid = board["uid"]
    existing = grafana.get_or_none(f"reading dashboard {uid}", lambda: api.dashboard.get_dashboard(uid))
    if existing is not None:
        meta = existing.get("meta") or {}
        if _strip(existing.get("dashboard") or {}) == _strip(board) and meta.get("folderUid") == FOLDER_UID:
            report.add("dashboard", board["title"], "unchanged")
            return
    payload = {"dashboard": {**board, "id": None}, "folderUid": FOLDER_UID, "overwrite": True,
               "message": PUSH_MESSAGE}
    grafana.call(f"saving dashboard {uid}", lambda: api.dashboard.update_dashboard(payload))
    report.add("dashboard", board["title"], "created" if existing is None else "updated")


def _push_contact_point(grafana: Grafana, report: PushReport, webhook_url: str) -> None:
    api = grafana.api
    body = alerts.contact_point(webhook_url)
    points = grafana.call("reading contact points",
                          lambda: api.alertingprovisioning.get_contactpoints(name=CONTACT_POINT)) or []
    if any(p.get("uid") == CONTACT_POINT_UID for p in points):
        grafana.call("updating the contact point",
                     lambda: api.alertingprovisioning.update_contactpoint(CONTACT_POINT_UID, body))
        report.add("contact point", CONTACT_POINT, "updated")
    else:
        grafana.call("creating the contact point", lambda: api.alertingprovisioning.create_contactpoint(body))
        report.add("contact point", CONTACT_POINT, "created")


def _push_rules(grafana: Grafana, report: PushReport) -> None:
    api = grafana.api
    group = alerts.api_rule_group()
    existing = grafana.get_or_none(
        "reading the alert rule group", lambda: api.alertingprovisioning.get_rule_group(FOLDER_UID, ALERT_GROUP)
    )
    grafana.call("saving the alert rule group",
                 lambda: api.alertingprovisioning.update_rule_group(FOLDER_UID, ALERT_GROUP, group))
    before = {r.get("uid") for r in (existing or {}).get("rules", [])}
    for rule in group["rules"]:
        report.add("alert rule", rule["title"], "updated" if rule["uid"] in before else "created")
