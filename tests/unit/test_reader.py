"""The read path's statement guard and owner-file handling (no ClickHouse needed)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from infra.clickhouse.reader import QueryRejected, live_owner, owner_file, single_statement
from rollout.settings import Settings


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT 1", "SELECT 1"),
        ("SELECT 1;", "SELECT 1"),
        ("SELECT ';' ;  ", "SELECT ';' "),
        ("SELECT 1 -- trailing; comment", "SELECT 1 -- trailing; comment"),
        ("/* ; */ SELECT 1", "/* ; */ SELECT 1"),
        ("SELECT 'it''s; fine'", "SELECT 'it''s; fine'"),
        ("SELECT 1; -- done", "SELECT 1"),
    ],
)
def test_single_statements_pass(sql: str, expected: str) -> None:
    assert single_statement(sql) == expected


@pytest.mark.parametrize("sql", ["SELECT 1; SELECT 2", "SELECT 1; DROP TABLE events_raw", "SELECT ';'; INSERT",
                                 ";", "   "])
def test_several_or_no_statements_are_refused(sql: str) -> None:
    with pytest.raises(QueryRejected):
        single_statement(sql)


def test_owner_file_of_a_dead_process_is_ignored(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    path = owner_file(settings)
    path.write_text(json.dumps({"pid": 2**22 + 12345, "sql_url": "http://127.0.0.1:1/sql",
                                "clickhouse_url": settings.clickhouse_url}))
    assert live_owner(settings) is None
    path.write_text(json.dumps({"pid": os.getpid(), "sql_url": "http://127.0.0.1:1/sql",
                                "clickhouse_url": settings.clickhouse_url}))
    assert live_owner(settings) is not None


def test_owner_file_for_another_engine_is_ignored(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    owner_file(settings).write_text(json.dumps({"pid": os.getpid(), "sql_url": "x",
                                                "clickhouse_url": "chdb:///elsewhere"}))
    assert live_owner(settings) is None
