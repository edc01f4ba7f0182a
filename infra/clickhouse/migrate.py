"""Ordered, idempotent SQL migrations from ``infra/clickhouse/migrations``, recorded in a table."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.resources import files

from infra.clickhouse.client import Client, quote_identifier
from rollout.errors import RolloutError

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_COMMENT = re.compile(r"--[^\n]*")


class MigrationError(RolloutError):
    """A migration failed or an applied migration was changed after the fact."""


@dataclass(frozen=True, slots=True)
class Migration:
    """One SQL file: its version, name, statements and checksum."""

    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        """SHA-256 of the file's text; a changed applied migration is an error, never re-run silently."""
        return hashlib.sha256(self.sql.encode()).hexdigest()

    def statements(self, database: str) -> list[str]:
        """The file's statements with ``{db}`` replaced by the quoted database name.

        Comments (``--`` to the end of the line) are removed first; migrations keep ``--`` and ``;``
        out of string literals so that this simple split stays right.
        """
        text = _COMMENT.sub("", self.sql)
        text = text.replace("{db}", quote_identifier(database))
        return [s.strip() for s in text.split(";") if s.strip()]


def load_migrations() -> list[Migration]:
    """Every migration file, in version order."""
    found: list[Migration] = []
    for entry in files("infra.clickhouse").joinpath("migrations").iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"two migrations share a version: {versions}")
    return found


def migrate(client: Client, database: str) -> list[Migration]:
    """Apply the migrations not yet recorded in ``schema_migrations``; return those applied now."""
    db = quote_identifier(database)
    client.command(f"CREATE DATABASE IF NOT EXISTS {db}")
    client.command(
        f"CREATE TABLE IF NOT EXISTS {db}.schema_migrations (version UInt32, name String, checksum String, "
        "applied_at DateTime64(3, 'UTC')) ENGINE = MergeTree ORDER BY version"
    )
    result = client.query(f"SELECT version, checksum FROM {db}.schema_migrations")
    applied = {int(v): str(c) for v, c in result.result_rows}
    done: list[Migration] = []
    for migration in load_migrations():
        if migration.version in applied:
            if applied[migration.version] != migration.checksum:
                raise MigrationError(
                    f"migration {migration.version:04d}_{migration.name} changed after it was applied; "
                    "add a new migration instead of editing an applied one"
                )
            continue
        for statement in migration.statements(database):
            try:
                client.command(statement)
            except Exception as exc:
                raise MigrationError(
                    f"migration {migration.version:04d}_{migration.name} failed: {str(exc).splitlines()[0]}"
                ) from exc
        client.insert(
            "schema_migrations",
            [[migration.version, migration.name, migration.checksum, datetime.now(UTC)]],
            column_names=["version", "name", "checksum", "applied_at"],
            database=database,
        )
        done.append(migration)
    return done
