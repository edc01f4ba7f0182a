"""docs/sql.md documents every column of every v_* view defined by the ClickHouse migrations."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MIGRATIONS = ROOT / "infra" / "clickhouse" / "migrations"
DOC = ROOT / "docs" / "sql.md"

CONTRACT_VIEWS = (
    "v_effective_throughput", "v_env_failures", "v_domain_quality", "v_policy_lag", "v_timing",
    "v_interruptions", "v_budget", "v_snapshots", "v_verifier_integrity", "v_undecidable", "v_environment_versions",
    "v_alerts", "v_trajectories",
)

_CREATE_TABLE = re.compile(r"^CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?\{db\}\.(\w+)\s*\(", re.I)
_CREATE_TABLE_AS = re.compile(r"^CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?\{db\}\.(\w+)\s+AS\s+\{db\}\.(\w+)", re.I)
_CREATE_VIEW = re.compile(
    r"^CREATE\s+(?:OR\s+REPLACE\s+)?VIEW\s+(?:IF\s+NOT\s+EXISTS\s+)?\{db\}\.(v_\w+)\s+AS\s+SELECT\b", re.I)
_ALIAS = re.compile(r"\bAS\s+(\w+)$", re.I)
_EXCEPT = re.compile(r"^\*\s*EXCEPT\s*\((.*)\)$", re.I | re.S)
_FROM = re.compile(r"\bFROM\b", re.I)
_SOURCE = re.compile(r"\{db\}\.(\w+)")
_NOT_COLUMNS = {"INDEX", "PROJECTION", "CONSTRAINT"}


# -- a small parser for the migration files --------------------------------------------------------


def _statements(sql: str) -> list[str]:
    """Statements of a migration file, `--` comments removed (the files put no `--` or `;` in strings)."""
    text = re.sub(r"--[^\n]*", "", sql)
    return [s.strip() for s in text.split(";") if s.strip()]


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside parentheses and quotes."""
    parts: list[str] = []
    depth, start, quote = 0, 0, ""
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"`":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return [p for p in parts if p]


def _matching_paren(text: str, open_at: int) -> int:
    """Index of the parenthesis closing the one at ``open_at`` (quotes skipped)."""
    depth, quote = 0, ""
    for i in range(open_at, len(text)):
        ch = text[i]
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"`":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return i
    raise ValueError(f"unbalanced parentheses in: {text[:80]!r}")


def _depth_at(text: str, pos: int) -> int:
    """Parenthesis depth at ``pos`` (quotes skipped)."""
    depth, quote = 0, ""
    for ch in text[:pos]:
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"`":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
    return depth


def _table_columns(statement: str, name_end: int) -> list[str]:
    open_at = statement.index("(", name_end - 1)
    body = statement[open_at + 1:_matching_paren(statement, open_at)]
    columns = []
    for item in _split_top_level(body):
        first = item.split()[0]
        if first.upper() not in _NOT_COLUMNS:
            columns.append(first.strip("`"))
    return columns


def _select_items(statement: str, select_end: int) -> tuple[list[str], str]:
    """The items of the view's outer SELECT list, and the text after its top-level FROM."""
    for match in _FROM.finditer(statement, select_end):
        if _depth_at(statement, match.start()) == 0:
            return _split_top_level(statement[select_end:match.start()]), statement[match.end():]
    raise ValueError(f"no top-level FROM in view: {statement[:80]!r}")


def _item_name(item: str) -> str:
    alias = _ALIAS.search(item)
    if alias:
        return alias.group(1)
    if re.fullmatch(r"\w+", item):
        return item
    raise ValueError(f"cannot name the select item {item!r}: give it an alias")


def view_columns(sql: str) -> dict[str, list[str]]:
    """Output columns of every ``CREATE VIEW {db}.v_*`` in the SQL text, in order."""
    tables: dict[str, list[str]] = {}
    views: dict[str, list[str]] = {}
    for statement in _statements(sql):
        table = _CREATE_TABLE.match(statement)
        if table:
            tables[table.group(1)] = _table_columns(statement, table.end())
            continue
        copy = _CREATE_TABLE_AS.match(statement)
        if copy:  # CREATE TABLE t AS source: the source's columns
            tables[copy.group(1)] = tables[copy.group(2)]
            continue
        view = _CREATE_VIEW.match(statement)
        if not view:
            continue
        items, after_from = _select_items(statement, view.end())
        columns: list[str] = []
        for item in items:
            excepted = _EXCEPT.match(item)
            if excepted:
                source = _SOURCE.search(after_from)
                if source is None:
                    raise ValueError(f"{view.group(1)}: no source table for {item!r}")
                source_columns = tables.get(source.group(1)) or views.get(source.group(1))
                if source_columns is None:
                    raise ValueError(f"{view.group(1)}: source {source.group(1)!r} is not defined before it")
                dropped = {c.strip().strip("`") for c in excepted.group(1).split(",")}
                columns.extend(c for c in source_columns if c not in dropped)
            else:
                columns.append(_item_name(item))
        views[view.group(1)] = columns
    return views


def migration_views() -> dict[str, list[str]]:
    """The v_* views of all migrations, applied in file order."""
    text = ";\n".join(p.read_text() for p in sorted(MIGRATIONS.glob("*.sql")))
    return view_columns(text)


# -- reading the document --------------------------------------------------------------------------


def view_section(doc: str, view: str) -> str | None:
    """The text of the ``## `view` `` section, up to the next level-2 heading."""
    sections = re.split(r"^(?=## )", doc, flags=re.M)
    for section in sections:
        heading = section.split("\n", 1)[0]
        if heading.startswith("## ") and f"`{view}`" in heading:
            return section
    return None


def undocumented(doc: str, view: str, columns: list[str]) -> list[str]:
    """Columns with no ``| column |`` table row in the view's section (all of them when there is no section)."""
    section = view_section(doc, view)
    if section is None:
        return list(columns)
    return [c for c in columns if not re.search(rf"^\|\s*`?{re.escape(c)}`?\s*\|", section, re.M)]


def documented_rows(doc: str, view: str) -> list[str]:
    """The column names the view's section lists in its table."""
    section = view_section(doc, view) or ""
    return re.findall(r"^\|\s*`(\w+)`\s*\|", section, re.M)


VIEWS = migration_views()
DOC_TEXT = DOC.read_text()


# -- tests -----------------------------------------------------------------------------------------


def test_parser_finds_the_contract_views() -> None:
    assert set(CONTRACT_VIEWS) <= set(VIEWS)
    throughput = VIEWS["v_effective_throughput"]
    assert throughput[:5] == ["run_id", "domain", "window_start", "window_end", "finished"]
    assert {"effective", "env_validity_rate", "effective_per_hour"} <= set(throughput)
    assert VIEWS["v_windows"] == ["run_id", "domain", "window_start", "version"]


def test_parser_expands_star_except_from_the_table() -> None:
    trajectories = VIEWS["v_trajectories"]
    assert trajectories[:3] == ["run_id", "domain", "trajectory_id"]
    assert "revision" in trajectories and "interruption_reasons" in trajectories
    assert "finish_window" not in trajectories and "version" not in trajectories
    assert "idx_trajectory" not in trajectories and "INDEX" not in trajectories


@pytest.mark.parametrize("view", sorted(VIEWS))
def test_every_view_column_is_documented(view: str) -> None:
    assert view_section(DOC_TEXT, view) is not None, f"docs/sql.md has no '## `{view}`' section"
    missing = undocumented(DOC_TEXT, view, VIEWS[view])
    assert not missing, f"docs/sql.md, section {view}: columns not documented: {missing}"


@pytest.mark.parametrize("view", sorted(VIEWS))
def test_doc_lists_no_column_the_view_lacks(view: str) -> None:
    extra = [c for c in documented_rows(DOC_TEXT, view) if c not in VIEWS[view]]
    assert not extra, f"docs/sql.md, section {view}: documents columns the view does not have: {extra}"


def test_a_new_view_column_missing_from_the_doc_is_reported() -> None:
    sql = (
        "CREATE TABLE IF NOT EXISTS {db}.m_timing (run_id String, finished UInt64, version UInt64) "
        "ENGINE = MergeTree ORDER BY run_id;\n"
        "CREATE VIEW IF NOT EXISTS {db}.v_timing AS\n"
        "SELECT run_id, finished, if(finished > 0, 1 / finished, NULL) AS brand_new_column\n"
        "FROM {db}.m_timing WHERE run_id IN (SELECT run_id FROM {db}.m_timing);\n"
    )
    columns = view_columns(sql)
    assert columns == {"v_timing": ["run_id", "finished", "brand_new_column"]}
    assert undocumented(DOC_TEXT, "v_timing", columns["v_timing"]) == ["brand_new_column"]
    assert undocumented(DOC_TEXT, "v_not_there", ["run_id"]) == ["run_id"]


def test_star_except_and_unnamed_items() -> None:
    sql = (
        "-- a comment; with a semicolon\n"
        "CREATE TABLE {db}.t (a UInt8, b DateTime64(3, 'UTC'), c Array(String), INDEX i a TYPE minmax GRANULARITY 1)"
        " ENGINE = MergeTree ORDER BY a;\n"
        "CREATE VIEW {db}.v_t AS SELECT * EXCEPT (b) FROM (SELECT * FROM {db}.t ORDER BY a LIMIT 1 BY a);\n"
    )
    assert view_columns(sql) == {"v_t": ["a", "c"]}
    with pytest.raises(ValueError, match="alias"):
        view_columns("CREATE VIEW {db}.v_x AS SELECT a + 1 FROM {db}.t")
