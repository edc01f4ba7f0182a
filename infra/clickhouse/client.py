"""Open a ClickHouse client for a URL: the embedded engine (chdb://path) or a server (http(s)://)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import clickhouse_connect
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import ClickHouseError

from rollout.errors import ConfigurationError, ServiceUnavailable

__all__ = ["EMBEDDED_SETTINGS", "Client", "connect", "embedded_path", "join_settings"]

EMBEDDED_SETTINGS: dict[str, Any] = {"use_query_condition_cache": 0, "enable_join_runtime_filters": 0}
"""Session settings of the embedded engine (see ``connect``)."""


def join_settings(client: Any) -> dict[str, Any]:
    """EMBEDDED_SETTINGS for one statement with a JOIN on any engine: those the server knows (an older server refuses
    a setting it does not know). The embedded engine has them for the whole session; a server has them only where
    a statement asks."""
    names = {str(row[0]) for row in client.query("SELECT name FROM system.settings WHERE name IN {names:Array(String)}",
                                                 parameters={"names": list(EMBEDDED_SETTINGS)}).result_rows}
    return {name: value for name, value in EMBEDDED_SETTINGS.items() if name in names}


def embedded_path(url: str) -> Path | None:
    """The data folder of a ``chdb://`` URL, or None for a server URL."""
    if not url.startswith("chdb://"):
        return None
    rest = url[len("chdb://"):]
    if rest in ("", "memory", ":memory:"):
        return None
    return Path(rest).expanduser().resolve()


def connect(url: str, *, database: str | None = None, create_database: bool = True, **kwargs: Any) -> Client:
    """Connect to ClickHouse with ``database`` as default (created when missing unless told not to).

    Errors say what to start or fix.
    """
    scheme = urlsplit(url).scheme
    if scheme not in ("chdb", "http", "https"):
        raise ConfigurationError(
            f"CLICKHOUSE_URL {url.split('@')[-1]!r} is not supported: use chdb://<folder> or http(s)://host:8123"
        )
    path = embedded_path(url)
    if path is not None:
        path.mkdir(parents=True, exist_ok=True)
    if scheme == "chdb":
        # ClickHouse 26.9 (chdb 4.4): a JOIN can leave a wrong entry in the query condition cache,
        # after which reads with the same filter return too few rows. Session settings survive the
        # read path's readonly=1, so the embedded engine runs with both features off.
        kwargs["settings"] = {**EMBEDDED_SETTINGS, **kwargs.get("settings", {})}
    try:
        client = clickhouse_connect.get_client(dsn=url, **kwargs)
    except ClickHouseError as exc:
        text = str(exc)
        # Two processes racing for one folder: the loser sees a lock error, or (when both start at
        # the same moment) a failed EmbeddedServer initialisation.
        if path is not None and ("already initialized" in text or "lock" in text.lower()
                                 or "EmbeddedServer" in text):
            raise ServiceUnavailable(
                f"the embedded ClickHouse at {path} is owned by another process; "
                "stop it or read through the running worker (rollout sql)"
            ) from exc
        raise ServiceUnavailable(
            f"cannot reach ClickHouse at {url.split('@')[-1]}: {text.splitlines()[0] if text else exc!r}; "
            "start the server or fix CLICKHOUSE_URL"
        ) from exc
    except OSError as exc:
        raise ServiceUnavailable(
            f"cannot reach ClickHouse at {url.split('@')[-1]}: {exc}; start the server or fix CLICKHOUSE_URL"
        ) from exc
    if database:
        if create_database:
            client.command(f"CREATE DATABASE IF NOT EXISTS {quote_identifier(database)}")
        client.database = database
    return client


def quote_identifier(name: str) -> str:
    """Quote a database or table name for ClickHouse SQL."""
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"
