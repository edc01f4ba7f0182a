"""Linter-style checks of generated dashboards and alert rules (the dashboard-linter's rules and ours)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

import yaml

from dashboards.defaults import (
    DATASOURCE_TYPE,
    DATASOURCE_UID,
    DATASOURCE_VARIABLE,
    EXPRESSION_DATASOURCE_UID,
    PLUGIN_VERSION,
    Format,
)

PANEL_DATASOURCE_UID = "${" + DATASOURCE_VARIABLE + "}"
THRESHOLD_TYPES = frozenset({"gt", "lt", "within_range", "outside_range"})
REDUCERS = frozenset({"last", "mean", "max", "min", "sum", "count", "median"})
NO_DATA_STATES = frozenset({"NoData", "Alerting", "OK", "KeepLast"})
EXEC_ERR_STATES = frozenset({"Error", "Alerting", "OK", "KeepLast"})

_SOURCE = re.compile(r"\b(?:FROM|JOIN)\s+([A-Za-z_][A-Za-z0-9_.]*)", re.IGNORECASE)
_CTE = re.compile(r"(?:\bWITH|,)\s*([A-Za-z_][A-Za-z0-9_]*)\s+AS\s*\(", re.IGNORECASE)
_TEMPLATE_VARIABLE = re.compile(r"\$\{|\$(?!__)[A-Za-z_]|\$__conditionalAll")


def sources(sql: str) -> set[str]:
    """Tables and views a query reads (names after FROM/JOIN, without its own CTE names)."""
    ctes = {m.group(1) for m in _CTE.finditer(sql)}
    return {m.group(1) for m in _SOURCE.finditer(sql)} - ctes


def _query_problems(where: str, sql: str) -> Iterator[str]:
    if not sql.strip():
        yield f"{where}: empty rawSql"
        return
    for name in sorted(sources(sql)):
        if not re.fullmatch(r"v_[a-z_]+", name):
            yield f"{where}: reads {name!r}; queries must read the v_* contract views only"
    if "${DS_" in sql:
        yield f"{where}: placeholder data source in the query"


def lint_dashboard(board: Mapping[str, Any]) -> list[str]:
    """Problems of one dashboard JSON: empty when it is fit to provision."""
    problems: list[str] = []
    name = board.get("uid") or board.get("title") or "?"
    for key in ("uid", "title", "description"):
        if not board.get(key):
            problems.append(f"{name}: no {key}")
    if len(str(board.get("uid", ""))) > 40:
        problems.append(f"{name}: uid longer than 40 characters")
    if "__inputs" in board:
        problems.append(f"{name}: __inputs (import placeholders) are not resolved by file provisioning")
    variables = {v.get("name"): v for v in board.get("templating", {}).get("list", [])}
    ds = variables.get(DATASOURCE_VARIABLE)
    if ds is None or ds.get("type") != "datasource" or ds.get("query") != DATASOURCE_TYPE:
        problems.append(f"{name}: needs a datasource variable {DATASOURCE_VARIABLE!r} querying {DATASOURCE_TYPE}")
    for var in variables.values():
        if var.get("type") == "query":
            where = f"{name} variable {var.get('name')}"
            if (var.get("datasource") or {}).get("uid") != PANEL_DATASOURCE_UID:
                problems.append(f"{where}: must use the ${{{DATASOURCE_VARIABLE}}} data source")
            query = var.get("query")
            sql = query if isinstance(query, str) else (query or {}).get("rawSql", "")
            problems.extend(_query_problems(where, sql))
    ids: set[int] = set()
    for panel in board.get("panels", []):
        problems.extend(_panel_problems(name, panel, ids))
    text = repr(board)
    if "${DS_" in text:
        problems.append(f"{name}: placeholder data source ${{DS_...}} found")
    return problems


def _panel_problems(board: str, panel: Mapping[str, Any], ids: set[int]) -> Iterator[str]:
    title = panel.get("title") or f"panel {panel.get('id')}"
    where = f"{board} / {title}"
    pid = panel.get("id")
    if not isinstance(pid, int):
        yield f"{where}: no numeric id"
    elif pid in ids:
        yield f"{where}: duplicate panel id {pid}"
    else:
        ids.add(pid)
    grid = panel.get("gridPos") or {}
    if not all(isinstance(grid.get(k), int) for k in ("x", "y", "w", "h")):
        yield f"{where}: incomplete gridPos"
    elif grid["w"] > 24 or grid["x"] + grid["w"] > 24 or grid["w"] <= 0 or grid["h"] <= 0:
        yield f"{where}: gridPos {grid} does not fit the 24-column grid"
    if panel.get("type") == "row":
        if not panel.get("title"):
            yield f"{where}: row without a title"
        return
    if not panel.get("title"):
        yield f"{where}: no title"
    if not panel.get("description"):
        yield f"{where}: no description"
    if not ((panel.get("fieldConfig") or {}).get("defaults") or {}).get("unit"):
        yield f"{where}: no unit"
    datasource = panel.get("datasource") or {}
    if datasource.get("uid") != PANEL_DATASOURCE_UID or datasource.get("type") != DATASOURCE_TYPE:
        yield f"{where}: panel data source must be {{type: {DATASOURCE_TYPE}, uid: {PANEL_DATASOURCE_UID}}}"
    targets = panel.get("targets") or []
    if not targets:
        yield f"{where}: no query"
    want = Format.TIME_SERIES if panel.get("type") == "timeseries" else Format.TABLE
    for target in targets:
        yield from _target_problems(where, target, want, PANEL_DATASOURCE_UID)
        sql = target.get("rawSql", "")
        if "v_trajectories" in sources(sql):
            yield (f"{where}: reads v_trajectories, which picks the newest record of every trajectory of the run "
                   "on each read; chart a window view instead")
        if "$__timeFilter(" not in sql and any(s != "v_alerts" for s in sources(sql)):
            yield f"{where}: query does not filter on the time range ($__timeFilter)"
        if "${run:singlequote}" not in sql:
            yield f"{where}: query ignores the run variable (IN (${{run:singlequote}}))"
        if "$__conditionalAll(" not in sql:
            yield f"{where}: query ignores the domain variable ($__conditionalAll)"
        if want is Format.TIME_SERIES and "$__timeInterval(" not in sql:
            yield f"{where}: time series without $__timeInterval buckets"


def _target_problems(where: str, target: Mapping[str, Any], fmt: Format, uid: str) -> Iterator[str]:
    ref = target.get("refId")
    at = f"{where} [{ref}]"
    if not ref:
        yield f"{where}: query without refId"
    if target.get("datasource") != {"type": DATASOURCE_TYPE, "uid": uid}:
        yield f"{at}: datasource must be {{type: {DATASOURCE_TYPE}, uid: {uid}}}"
    if target.get("editorType") != "sql":
        yield f"{at}: editorType must be 'sql'"
    if target.get("pluginVersion") != PLUGIN_VERSION:
        yield f"{at}: pluginVersion must be {PLUGIN_VERSION!r}"
    if target.get("format") != int(fmt) or isinstance(target.get("format"), bool):
        yield f"{at}: format must be the number {int(fmt)}"
    if target.get("queryType") != ("timeseries" if fmt is Format.TIME_SERIES else "table"):
        yield f"{at}: queryType does not match format {int(fmt)}"
    yield from _query_problems(at, target.get("rawSql", ""))


def lint_rules_file(document: Mapping[str, Any]) -> list[str]:
    """Problems of an alert rules provisioning file (the file shape)."""
    problems: list[str] = []
    if document.get("apiVersion") != 1:
        problems.append("rules file: apiVersion must be 1")
    groups = document.get("groups") or []
    if not groups:
        problems.append("rules file: no groups")
    uids: set[str] = set()
    for group in groups:
        for key in ("orgId", "name", "folder", "interval", "rules"):
            if not group.get(key):
                problems.append(f"group {group.get('name')}: no {key}")
        for rule in group.get("rules", []):
            uid = rule.get("uid", "")
            if uid in uids:
                problems.append(f"rule {uid}: duplicate uid")
            uids.add(uid)
            problems.extend(lint_rule(rule))
    return problems


def lint_rule(rule: Mapping[str, Any]) -> list[str]:
    """Problems of one alert rule (file or API shape)."""
    where = f"rule {rule.get('uid') or rule.get('title')}"
    problems = [f"{where}: no {k}" for k in ("uid", "title", "condition", "data", "for") if not rule.get(k)]
    if rule.get("noDataState") not in NO_DATA_STATES:
        problems.append(f"{where}: noDataState must be one of {sorted(NO_DATA_STATES)}")
    if rule.get("execErrState") not in EXEC_ERR_STATES:
        problems.append(f"{where}: execErrState must be one of {sorted(EXEC_ERR_STATES)}")
    labels = rule.get("labels") or {}
    for key in ("severity", "run", "domain"):
        if key not in labels:
            problems.append(f"{where}: no {key} label")
    annotations = rule.get("annotations") or {}
    if not annotations.get("summary"):
        problems.append(f"{where}: no summary annotation")
    if "/d/" not in " ".join(map(str, annotations.values())):
        problems.append(f"{where}: no link to a dashboard in the annotations")
    for kind, texts in (("label", labels), ("annotation", annotations)):
        for key, text in texts.items():
            if "$" in str(text):
                problems.append(f"{where}: {kind} {key} contains '$' (file provisioning may expand it as an "
                                "environment variable); template with .Labels / .Values")
    refs = {item.get("refId") for item in rule.get("data", [])}
    if rule.get("condition") not in refs:
        problems.append(f"{where}: condition {rule.get('condition')!r} is not a refId of its data")
    for item in rule.get("data", []):
        problems.extend(_rule_data_problems(where, item, refs))
    return problems


def _rule_data_problems(where: str, item: Mapping[str, Any], refs: set[Any]) -> Iterator[str]:
    ref = item.get("refId")
    model = item.get("model") or {}
    at = f"{where} [{ref}]"
    if model.get("refId") != ref:
        yield f"{at}: model refId differs from the query's"
    if item.get("datasourceUid") == EXPRESSION_DATASOURCE_UID:
        kind = model.get("type")
        if model.get("expression", "").lstrip("$") not in refs:
            yield f"{at}: expression refers to an unknown refId"
        if kind == "reduce":
            if model.get("reducer") not in REDUCERS:
                yield f"{at}: reducer {model.get('reducer')!r} unknown"
        elif kind == "threshold":
            conditions = model.get("conditions") or []
            if len(conditions) != 1:
                yield f"{at}: a threshold needs exactly one condition"
            for condition in conditions:
                kind_ = (condition.get("evaluator") or {}).get("type")
                if kind_ not in THRESHOLD_TYPES:
                    yield f"{at}: threshold type {kind_!r} is not accepted (use gt, lt, within_range, outside_range)"
        elif kind != "math":
            yield f"{at}: expression type {kind!r} not used by this project"
        return
    if item.get("datasourceUid") != DATASOURCE_UID:
        yield f"{at}: must query the data source {DATASOURCE_UID!r}"
    if not isinstance(model.get("intervalMs"), int) or model["intervalMs"] <= 0:
        yield f"{at}: the model needs intervalMs (else $__timeInterval buckets by 1 s)"
    span = item.get("relativeTimeRange") or {}
    if not isinstance(span.get("from"), int) or span["from"] <= 0:
        yield f"{at}: relativeTimeRange.from must be a positive number of seconds"
    yield from _target_problems(at, model, Format.TABLE, DATASOURCE_UID)
    if _TEMPLATE_VARIABLE.search(model.get("rawSql", "")):
        yield f"{at}: alert queries get no template variables or $__conditionalAll"


def lint_files(files: Mapping[str, str]) -> list[str]:
    """Problems of rendered files: every dashboard JSON and the alert rules YAML (by project path)."""
    problems: list[str] = []
    for path, content in sorted(files.items()):
        if path.endswith(".json"):
            problems += [f"{path}: {p}" for p in lint_dashboard(json.loads(content))]
        elif path.endswith("alerting/rules.yaml"):
            problems += [f"{path}: {p}" for p in lint_rules_file(yaml.safe_load(content))]
    return problems
