"""What deploy/components/monitoring asks of the metrics: every PromQL expression of its alerts and
dashboard panels, parsed by promql-parser (a query that does not parse raises), and the metric names
they select, with the sample names each name may be read as in a /metrics text."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPONENT = REPO / "deploy" / "components" / "monitoring"
RULES = COMPONENT / "prometheusrule.yaml"
DASHBOARD = COMPONENT / "dashboards" / "topoalloc.json"
# The selector children of each node type promql-parser gives (others are leaves).
_CHILDREN = ("lhs", "rhs", "expr", "args", "vector_selector", "param")


def rule_document() -> dict[str, Any]:
    doc = yaml.safe_load(RULES.read_text())
    assert isinstance(doc, dict)
    return doc


def alerts() -> list[dict[str, Any]]:
    return [r for g in rule_document()["spec"]["groups"] for r in g["rules"] if "alert" in r]


def dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text())
    assert isinstance(data, dict)
    return data


def panels(board: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every panel, those inside collapsed rows included."""
    out = []
    for panel in (board or dashboard())["panels"]:
        out.append(panel)
        out += panel.get("panels") or []
    return out


def expressions() -> dict[str, str]:
    """Where each query is (alert NAME / panel TITLE #refId) -> its PromQL."""
    out = {f"alert {r['alert']}": str(r["expr"]) for r in alerts()}
    for panel in panels():
        for target in panel.get("targets") or []:
            out[f"panel {panel['title']} #{target['refId']}"] = str(target["expr"])
    return out


def selected_names(expr: str) -> set[str]:
    """The metric names an expression selects (raises ValueError when it does not parse)."""
    names: set[str] = set()
    for node in _walk(promql_parser.parse(expr)):
        if isinstance(node, promql_parser.VectorSelector):
            name = node.name or next((m.value for m in node.matchers.matchers if m.name == "__name__"), None)
            assert name, f"{expr}: a selector without a metric name"
            names.add(str(name))
    return names


def _walk(node: Any) -> Iterator[Any]:
    yield node
    for attr in _CHILDREN:
        value = getattr(node, attr, None)
        if value is None:
            continue
        for child in value if isinstance(value, list) else [value]:
            yield from _walk(child)


def used_names() -> dict[str, set[str]]:
    """metric name -> where it is used."""
    out: dict[str, set[str]] = {}
    for where, expr in expressions().items():
        for name in selected_names(expr):
            out.setdefault(name, set()).add(where)
    return out


def sample_names(family: str, kind: str) -> set[str]:
    """The names a family of this type is read by in PromQL: a counter's `_total`, a histogram's
    `_bucket`, `_sum`, `_count`, a gauge's own name."""
    if kind == "counter":
        return {family + "_total"}
    if kind == "histogram":
        return {family + s for s in ("_bucket", "_sum", "_count")}
    if kind == "summary":
        return {family, family + "_sum", family + "_count"}
    return {family}
