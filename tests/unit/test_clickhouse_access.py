"""The server access plan: idempotent DDL, a reader that can only read, passwords quoted safely."""

from __future__ import annotations

from typer.testing import CliRunner

from infra.clickhouse.access import AccessPlan, _literal, access_statements
from infra.clickhouse.migrate import load_migrations
from rollout.cli import app
from rollout.commands import register_all


def test_every_statement_is_idempotent_and_the_reader_is_read_only() -> None:
    statements = access_statements(AccessPlan("rollout", "grafana", "pw", "worker", "pw2"))
    creates = [s for s in statements if s.startswith("CREATE")]
    assert creates and all(" IF NOT EXISTS " in s for s in creates)
    assert "GRANT SELECT ON `rollout`.* TO rollout_reader" in statements
    profile = next(s for s in statements if "SETTINGS PROFILE IF NOT EXISTS" in s)
    assert "readonly = 1" in profile and "CHANGEABLE_IN_READONLY" in profile
    reader = next(s for s in statements if s.startswith("CREATE USER IF NOT EXISTS `grafana`"))
    assert "DEFAULT ROLE rollout_reader" in reader and "INSERT" not in reader


def test_the_writer_may_run_every_kind_of_migration_statement() -> None:
    statements = access_statements(AccessPlan("rollout", "grafana", "pw", "worker", "pw2"))
    grant = next(s for s in statements if s.startswith("GRANT") and s.endswith("TO rollout_writer"))
    granted = {p.strip() for p in grant.removeprefix("GRANT ").split(" ON ")[0].split(",")}
    privilege = {"CREATE TABLE": "CREATE TABLE", "CREATE VIEW": "CREATE VIEW", "CREATE MATERIALIZED": "CREATE VIEW",
                 "DROP TABLE": "DROP TABLE", "DROP VIEW": "DROP VIEW", "INSERT INTO": "INSERT",
                 "ALTER TABLE": "ALTER SETTINGS"}
    # CREATE OR REPLACE VIEW replaces a view: it needs both CREATE VIEW and DROP VIEW.
    replaces = [s for m in load_migrations() for s in m.statements("rollout") if s.startswith("CREATE OR REPLACE")]
    assert all(s.startswith("CREATE OR REPLACE VIEW ") for s in replaces)
    if replaces:
        privilege["CREATE OR"] = "CREATE VIEW"
        assert "DROP VIEW" in granted
    alters = [s for m in load_migrations() for s in m.statements("rollout") if s.startswith("ALTER TABLE")]
    assert all(" MODIFY SETTING " in s for s in alters)  # the only ALTER the grant above covers
    kinds = {" ".join(s.split()[:2]) for m in load_migrations() for s in m.statements("rollout")}
    assert kinds <= set(privilege), kinds - set(privilege)
    assert {privilege[k] for k in kinds} <= granted
    assert "SELECT" in granted  # the materialized view and the INSERT ... SELECT read a table


def _parse_literal(text: str) -> tuple[str, int]:
    """Read a quoted literal the way ClickHouse does (backslash escapes); return its value and where it ended."""
    assert text[0] == "'"
    value, i = [], 1
    while text[i] != "'":
        if text[i] == "\\":
            i += 1
        value.append(text[i])
        i += 1
    return "".join(value), i


def test_hostile_passwords_stay_inside_their_literal() -> None:
    for password in ("x' ; DROP USER default; --", "back\\slash'", "''", "\\'"):
        literal = _literal(password)
        value, end = _parse_literal(literal)
        assert value == password
        assert end == len(literal) - 1, literal


def test_the_command_refuses_the_embedded_engine() -> None:
    register_all(app)
    result = CliRunner().invoke(app, ["infra", "clickhouse-users", "--admin-url", "chdb:///tmp/x",
                                      "--reader-password", "a", "--writer-password", "b"])
    assert result.exit_code != 0
    assert "embedded engine has no users" in result.output
