"""Grafana's file-provisioning documents for the data source and the dashboard provider."""

from __future__ import annotations

from typing import Any

from dashboards.defaults import (
    CLICKHOUSE_ENV,
    DATASOURCE_NAME,
    DATASOURCE_TYPE,
    DATASOURCE_UID,
    FOLDER_TITLE,
    FOLDER_UID,
    ORG_ID,
)

DASHBOARDS_PATH = "/var/lib/grafana/dashboards/rollout"
"""Where the Grafana container sees dashboards/generated/ (infra/compose.yaml mounts it there)."""


def datasource_settings(*, host: str, port: str | int, protocol: str, username: str,
                        database: str, secure: bool = False) -> dict[str, Any]:
    """The data source's ``jsonData``: where and as whom Grafana reads ClickHouse."""
    return {
        "host": host,
        "port": port,
        "protocol": protocol,
        "secure": secure,
        "username": username,
        "defaultDatabase": database,
        "dialTimeout": "10",
        "queryTimeout": "60",
    }


def datasource(json_data: dict[str, Any]) -> dict[str, Any]:
    """The data source without its secret: a fixed uid the rules and dashboards refer to."""
    return {
        "name": DATASOURCE_NAME,
        "type": DATASOURCE_TYPE,
        "uid": DATASOURCE_UID,
        "access": "proxy",
        "isDefault": True,
        "jsonData": json_data,
    }


def datasources_file() -> dict[str, Any]:
    """``datasources/clickhouse.yaml``: connection from environment variables, a read-only ClickHouse user."""
    json_data = datasource_settings(
        host="$" + CLICKHOUSE_ENV["host"],
        port="$" + CLICKHOUSE_ENV["port"],
        protocol="$" + CLICKHOUSE_ENV["protocol"],
        username="$" + CLICKHOUSE_ENV["username"],
        database="$" + CLICKHOUSE_ENV["database"],
    )
    return {
        "apiVersion": 1,
        "datasources": [{
            **datasource(json_data),
            "orgId": ORG_ID,
            "editable": False,
            "secureJsonData": {"password": "$" + CLICKHOUSE_ENV["password"]},
        }],
    }


def dashboard_provider_file() -> dict[str, Any]:
    """``dashboards/provider.yaml``: the generated dashboards, read-only in the Rollout folder."""
    return {
        "apiVersion": 1,
        "providers": [{
            "name": "rollout",
            "orgId": ORG_ID,
            "type": "file",
            "folder": FOLDER_TITLE,
            "folderUid": FOLDER_UID,
            "allowUiUpdates": False,
            "disableDeletion": True,
            "updateIntervalSeconds": 30,
            "options": {"path": DASHBOARDS_PATH, "foldersFromFilesStructure": False},
        }],
    }
