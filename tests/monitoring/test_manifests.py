"""deploy/components/monitoring in the shapes its consumers read: the ServiceMonitor, PodMonitor and
PrometheusRule against the Prometheus Operator's own CRD schemas (tests/monitoring/crds, with no
field the schema does not know, which the API server would drop), every alert with its runbook, the
Grafana dashboard as Grafana needs it, each alert explained in docs/monitoring.md, and the
component rendered by the installer as `kubectl kustomize` renders it."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.support import monitoring
from topoalloc.commands.installer.kustomize import build, ident

CRDS = Path(__file__).parent / "crds"
SCHEMAS = {
    "PrometheusRule": "prometheusrules",
    "ServiceMonitor": "servicemonitors",
    "PodMonitor": "podmonitors",
}
REPO = monitoring.REPO


def schema(kind: str) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all((CRDS / f"{SCHEMAS[kind]}.yaml").read_text()) if d]
    version = next(v for v in docs[0]["spec"]["versions"] if v["name"] == "v1")
    return dict(version["schema"]["openAPIV3Schema"])


def unknown_fields(doc: Any, node: dict[str, Any], where: str = "") -> list[str]:
    """Fields of `doc` that the structural schema `node` does not declare (the API server prunes
    them, or refuses them under strict field validation)."""
    out: list[str] = []
    if isinstance(doc, dict) and node.get("type") == "object":
        if node.get("x-kubernetes-preserve-unknown-fields"):
            return out
        props = node.get("properties")
        extra = node.get("additionalProperties")
        for key, value in doc.items():
            if props is not None and key in props:
                out += unknown_fields(value, props[key], f"{where}.{key}")
            elif isinstance(extra, dict):
                out += unknown_fields(value, extra, f"{where}.{key}")
            elif props is not None and where != ".metadata":
                out.append(f"{where}.{key}")
    elif isinstance(doc, list) and isinstance(node.get("items"), dict):
        for i, item in enumerate(doc):
            out += unknown_fields(item, node["items"], f"{where}[{i}]")
    return out


def component_docs() -> list[dict[str, Any]]:
    return build(REPO / "deploy", components=(monitoring.COMPONENT,))


def problems(doc: dict[str, Any]) -> list[str]:
    node = schema(doc["kind"])
    found = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in
             jsonschema.Draft7Validator(node).iter_errors(doc)]  # fmt: skip
    return found + [f"{f}: not in the schema" for f in unknown_fields(doc, node)]


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_the_monitors_and_rules_are_valid_in_the_operators_schema(kind: str) -> None:
    doc = next(d for d in component_docs() if d["kind"] == kind)
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    assert problems(doc) == []


def test_the_schema_check_refuses_what_the_api_server_would() -> None:
    rule = next(d for d in component_docs() if d["kind"] == "PrometheusRule")
    bad = copy.deepcopy(rule)
    bad["spec"]["groups"][0]["rules"][0]["for"] = "two minutes"
    assert any("for" in p for p in problems(bad))
    typo = copy.deepcopy(rule)
    typo["spec"]["groups"][0]["rules"][0]["annotation"] = {"summary": "x"}
    assert problems(typo) == [".spec.groups[0].rules[0].annotation: not in the schema"]


def test_the_monitors_select_what_the_bases_serve() -> None:
    docs = {ident(d)[1:]: d for d in component_docs() + build(REPO / "daemonset")}
    sm = docs[("ServiceMonitor", "topoalloc-system", "topoalloc-allocator")]
    services = [
        d for (kind, ns, _n), d in docs.items()
        if kind == "Service" and ns == "topoalloc-system"
        and sm["spec"]["selector"]["matchLabels"].items() <= (d["metadata"].get("labels") or {}).items()
    ]  # fmt: skip
    assert [s["metadata"]["name"] for s in services] == ["topoalloc-allocator-metrics"]
    port = next(p for p in services[0]["spec"]["ports"] if p["name"] == sm["spec"]["endpoints"][0]["port"])
    allocator = docs[("Deployment", "topoalloc-system", "topoalloc-allocator")]
    assert port["targetPort"] in {
        p["name"] for p in allocator["spec"]["template"]["spec"]["containers"][0]["ports"]
    }
    pm = docs[("PodMonitor", "topoalloc-system", "topoalloc-agent")]
    agent = docs[("DaemonSet", "topoalloc-system", "topoalloc-agent")]
    pod = agent["spec"]["template"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    ports = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
    config = yaml.safe_load(docs[("ConfigMap", "topoalloc-system", "topoalloc-agent")]["data"]["agent.yaml"])
    assert ports[pm["spec"]["podMetricsEndpoints"][0]["port"]] == config["metrics"]["port"]
    assert config["metrics"]["address"] == "0.0.0.0" and config["healthAddress"] == "127.0.0.1"


def test_every_alert_has_a_summary_description_runbook_severity_and_a_wait() -> None:
    alerts = monitoring.alerts()
    names = {a["alert"] for a in alerts}
    assert names == {
        "TopoallocAllocatorNoLeader",
        "TopoallocWebhookErrors",
        "TopoallocPodsGatedTooLong",
        "TopoallocDevicesUnhealthy",
        "TopoallocDeviceNotRefreshed",
        "TopoallocClaimPrepareFailures",
        "TopoallocDefragmentationStuck",
    }
    for alert in alerts:
        notes = alert["annotations"]
        assert {"summary", "description", "runbook"} <= set(notes), alert["alert"]
        assert all(len(notes[k].split()) >= 5 for k in ("summary", "description", "runbook")), alert["alert"]
        assert alert["labels"]["severity"] in ("critical", "warning"), alert["alert"]
        assert alert.get("for"), alert["alert"]


def test_docs_explain_every_alert() -> None:
    text = (REPO / "docs" / "monitoring.md").read_text()
    headings = set(re.findall(r"^### `?(\w+)`?", text, flags=re.M))
    assert {a["alert"] for a in monitoring.alerts()} <= headings


def test_the_dashboard_has_what_grafana_needs() -> None:
    board = monitoring.dashboard()
    assert board["uid"] and len(board["uid"]) <= 40 and board["title"]
    assert isinstance(board["schemaVersion"], int) and board["schemaVersion"] >= 36
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )
    panels = monitoring.panels(board)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    graphs = [p for p in panels if p["type"] != "row"]
    assert len(graphs) >= 10
    for panel in graphs:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        assert all(t["expr"] and t["datasource"] == panel["datasource"] for t in panel["targets"]), panel[
            "title"
        ]
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24 and pos["h"] > 0, panel["title"]
    titles = " ".join(p["title"].lower() for p in graphs)
    for wanted in ("placements", "latency", "gang", "gpu use", "fragmentation", "nvlink", "holds"):
        assert wanted in titles


def test_the_dashboard_configmap_carries_the_file_and_the_sidecar_label() -> None:
    cm = next(
        d
        for d in component_docs()
        if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "topoalloc-dashboard"
    )
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["data"]["topoalloc.json"] == monitoring.DASHBOARD.read_text()


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (for kustomize) is not installed")
def test_the_component_renders_as_kubectl_kustomize_renders_it(tmp_path: Path) -> None:
    shutil.copytree(REPO / "deploy", tmp_path / "deploy")
    kust = tmp_path / "deploy" / "kustomization.yaml"
    kust.write_text(kust.read_text() + "components:\n  - components/monitoring\n")
    out = subprocess.run(
        ["kubectl", "kustomize", str(tmp_path / "deploy")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    theirs = {ident(d): d for d in yaml.safe_load_all(out.stdout) if d}
    ours = {ident(d): d for d in component_docs()}
    assert set(ours) == set(theirs)
    for key in ours:
        if key[1] in SCHEMAS or key[3] == "topoalloc-dashboard":
            assert ours[key] == theirs[key], key
