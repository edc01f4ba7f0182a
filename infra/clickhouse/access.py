"""Least-privilege access on a ClickHouse server: read-only role and user for readers, a writer for the worker.

The embedded engine has no users (one process, loopback read path with readonly=1), so this applies to
servers only. Run once with an administrator's URL: ``rollout infra clickhouse-users --admin-url …``.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.clickhouse.client import quote_identifier

READER_ROLE = "rollout_reader"
WRITER_ROLE = "rollout_writer"
READER_PROFILE = "rollout_reader_profile"


@dataclass(frozen=True)
class AccessPlan:
    """Who gets which access to the platform's database."""

    database: str
    reader_user: str
    reader_password: str
    writer_user: str
    writer_password: str
    max_execution_time_s: int = 60


def _literal(value: str) -> str:
    """A ClickHouse string literal (DDL takes no query parameters for passwords)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def access_statements(plan: AccessPlan) -> list[str]:
    """The idempotent DDL that creates the roles, the reader's settings profile and both users."""
    db = quote_identifier(plan.database)
    reader, writer = quote_identifier(plan.reader_user), quote_identifier(plan.writer_user)
    return [
        f"CREATE ROLE IF NOT EXISTS {READER_ROLE}",
        f"GRANT SELECT ON {db}.* TO {READER_ROLE}",
        f"CREATE ROLE IF NOT EXISTS {WRITER_ROLE}",
        # The worker applies the migrations, which also replace views and drop tables they supersede.
        f"GRANT SELECT, INSERT, CREATE TABLE, CREATE VIEW, CREATE DATABASE, DROP TABLE, DROP VIEW, ALTER UPDATE, "
        f"ALTER DELETE, ALTER SETTINGS ON {db}.* TO {WRITER_ROLE}",
        # readonly=1 refuses writes, DDL and settings changes; Grafana may still lower its own timeout.
        f"CREATE SETTINGS PROFILE IF NOT EXISTS {READER_PROFILE} SETTINGS readonly = 1, "
        f"max_execution_time = {int(plan.max_execution_time_s)} CHANGEABLE_IN_READONLY",
        f"CREATE USER IF NOT EXISTS {reader} IDENTIFIED WITH sha256_password BY {_literal(plan.reader_password)} "
        f"SETTINGS PROFILE {READER_PROFILE} DEFAULT ROLE {READER_ROLE}",
        f"GRANT {READER_ROLE} TO {reader}",
        f"CREATE USER IF NOT EXISTS {writer} IDENTIFIED WITH sha256_password BY {_literal(plan.writer_password)} "
        f"DEFAULT ROLE {WRITER_ROLE}",
        f"GRANT {WRITER_ROLE} TO {writer}",
    ]
