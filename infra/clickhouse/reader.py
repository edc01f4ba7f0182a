"""Read-only SQL for people and tools: direct to ClickHouse, or through the worker that owns the engine."""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.clickhouse.client import connect, embedded_path
from rollout.errors import PermanentError, ServiceUnavailable
from rollout.settings import Settings

OWNER_FILE = "worker.json"


class QueryRejected(PermanentError):
    """ClickHouse or the worker refused the query (syntax, not a read, unknown table)."""


@dataclass(frozen=True, slots=True)
class QueryResult:
    """Column names, ClickHouse type names and rows of a read."""

    columns: list[str]
    types: list[str]
    rows: list[list[Any]]


def owner_file(settings: Settings) -> Path:
    """Where the worker that owns the embedded engine says how to reach it."""
    return settings.data_dir / OWNER_FILE


def live_owner(settings: Settings) -> dict[str, Any] | None:
    """The owner record when a live worker owns this embedded ClickHouse, else None (stale files ignored)."""
    if not settings.clickhouse_embedded:
        return None
    path = owner_file(settings)
    try:
        record: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    pid = int(record.get("pid", 0))
    if pid <= 0 or record.get("clickhouse_url") != settings.clickhouse_url:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return record


def single_statement(sql: str) -> str:
    """Return the statement without a trailing ``;``; refuse text holding more than one statement.

    Quotes (' " `) and comments (-- and /* */) are skipped so a ``;`` inside them does not count.
    """
    i, n = 0, len(sql)
    end: int | None = None
    while i < n:
        ch = sql[i]
        if end is not None and not ch.isspace():
            if sql.startswith("--", i):
                nl = sql.find("\n", i)
                i = n if nl < 0 else nl + 1
                continue
            raise QueryRejected("only one statement per query is allowed")
        if ch in "'\"`":
            j = i + 1
            while j < n and sql[j] != ch:
                j += 2 if sql[j] == "\\" else 1
            i = j + 1
        elif sql.startswith("--", i):
            nl = sql.find("\n", i)
            i = n if nl < 0 else nl + 1
        elif sql.startswith("/*", i):
            close = sql.find("*/", i + 2)
            i = n if close < 0 else close + 2
        elif ch == ";":
            end = i
            i += 1
        else:
            i += 1
    statement = sql if end is None else sql[:end]
    if not statement.strip():
        raise QueryRejected("the query is empty")
    keyword = _first_keyword(statement)
    if keyword not in READ_KEYWORDS:
        raise QueryRejected(
            f"only reads are allowed ({', '.join(sorted(READ_KEYWORDS))}); got {keyword or 'nothing'}"
        )
    return statement


READ_KEYWORDS = frozenset({"SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXPLAIN", "EXISTS"})
"""Statements the read path runs; ClickHouse's readonly=1 refuses writes, DDL and settings changes too."""


def _first_keyword(statement: str) -> str:
    """The statement's first word, after comments, whitespace and opening parentheses."""
    text = re.sub(r"--[^\n]*|/\*.*?\*/", " ", statement, flags=re.S)
    match = re.match(r"[\s(]*([A-Za-z]+)", text)
    return match.group(1).upper() if match else ""


def run_read(client: Any, sql: str, parameters: dict[str, Any] | None) -> QueryResult:
    """Run one read with readonly=1 (writes, DDL and settings changes are refused by ClickHouse)."""
    sql = single_statement(sql)
    try:
        result = client.query(sql, parameters=parameters or {}, settings={"readonly": 1})
    except Exception as exc:
        text = str(exc).strip()
        raise QueryRejected(text.splitlines()[0] if text else repr(exc)) from exc
    types = [t.name for t in result.column_types]
    return QueryResult(list(result.column_names), types, [list(r) for r in result.result_rows])


def query(settings: Settings, sql: str, parameters: dict[str, Any] | None = None, *, timeout: float = 60.0
          ) -> QueryResult:
    """Run a read: through the owning worker when there is one, else on a client of our own."""
    owner = live_owner(settings)
    if owner is not None:
        return _query_worker(str(owner["sql_url"]), sql, parameters, timeout)
    path = embedded_path(settings.clickhouse_url)
    if path is not None and not path.exists():
        raise ServiceUnavailable(
            f"no data yet at {path}: run `rollout worker` (or `rollout demo`) to create and fill it"
        )
    client = connect(settings.clickhouse_url, database=settings.clickhouse_database, create_database=False)
    try:
        return run_read(client, sql, parameters)
    finally:
        client.close()


def _query_worker(url: str, sql: str, parameters: dict[str, Any] | None, timeout: float) -> QueryResult:
    body = json.dumps({"query": sql, "parameters": parameters or {}}, default=str).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            data = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read()).get("error", str(exc))
        except ValueError:
            message = str(exc)
        raise QueryRejected(message) from exc
    except (urllib.error.URLError, OSError) as exc:
        raise ServiceUnavailable(
            f"the worker that owns the embedded ClickHouse did not answer at {url} ({exc}); "
            "is `rollout worker` still running?"
        ) from exc
    return QueryResult(data["columns"], data["types"], data["rows"])
