"""Scenario: monitoring on the real control plane of each release.

The Prometheus Operator's CRDs (tests/monitoring/crds, as its repository ships them) applied to the
API server: `install --dry-run --monitoring` refuses before they are served and renders once they
are; the component (ServiceMonitor, PodMonitor, PrometheusRule, dashboard ConfigMap) is applied for
real with server-side apply and a rule the schema refuses is refused by the API server. Then a small
workload, first in the tier's extender mode (a 2-GPU pod bound through kube-scheduler's extender
calls), then in placement mode with defragmentation on (dry run) on two DGX H100 plugin nodes (an
NVLink pair placed, a 2 x 8-GPU gang that cannot fit and waits at its gates): every metric an alert
or a dashboard panel names is read from the real allocator's and agents' /metrics over HTTP, each
in the form it is queried by (a counter's `_total`, a histogram's `_bucket`/`_sum`/`_count`)."""

from __future__ import annotations

import re
import subprocess
import urllib.request
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.cluster.harness import ClusterEnv, gpu_pod
from tests.cluster.placement_mode import placement_mode
from tests.support import monitoring
from tests.support.cluster_product import topoalloc_argv
from tests.support.controlplane import ApiStatus, wait_until
from tests.support.processes import Process
from topoalloc.commands.installer.kustomize import build

CRDS = sorted((monitoring.REPO / "tests" / "monitoring" / "crds").glob("*.yaml"))
CRD_NAMES = ("prometheusrules", "servicemonitors", "podmonitors")
API = "/apis/monitoring.coreos.com/v1/namespaces/topoalloc-system"
EXTENDER_NODE = "mon-ext"
NODES = ("mon-a", "mon-b")
PG = "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups"
GROUP_LABEL = "scheduling.x-k8s.io/pod-group"


def samples(text: str) -> dict[str, float]:
    """Sample name with its labels -> value, from a /metrics text (the client's own parser)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def names(found: dict[str, float]) -> set[str]:
    return {key.partition("{")[0] for key in found}


def allocator_metrics(cluster: ClusterEnv) -> dict[str, float]:
    status, text = cluster.leader().health("/metrics")
    assert status == 200
    return samples(text)


def agent_metrics(agent: Process) -> dict[str, float]:
    """The agent's metrics listener, found by the port its log names (it listens on port 0 here)."""
    port = wait_until(
        lambda: (m := re.search(r"metrics on 127\.0\.0\.1:(\d+)", agent.log.read_text())) and int(m.group(1)),
        timeout=30,
        what=f"{agent.name}'s metrics port",
    )
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        assert answer.status == 200
        return samples(answer.read().decode())


def install_dry_run(cluster: ClusterEnv) -> subprocess.CompletedProcess[str]:
    argv = topoalloc_argv(
        "install", "--dry-run", "--monitoring", "--kubeconfig", str(cluster.cp.admin_kubeconfig)
    )
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def served(cluster: ClusterEnv) -> bool:
    try:
        cluster.cp.admin.get("/apis/monitoring.coreos.com/v1")
    except ApiStatus:
        return False
    return True


def test_the_component_loads_where_the_operators_crds_are_served(cluster: ClusterEnv) -> None:
    assert not served(cluster)
    refused = install_dry_run(cluster)
    assert refused.returncode == 1, refused
    assert "monitoring.coreos.com/v1 ServiceMonitor, PodMonitor, PrometheusRule not served" in refused.stderr
    docs = [
        d
        for d in build(monitoring.REPO / "deploy", components=(monitoring.COMPONENT,))
        if d["kind"] in ("ServiceMonitor", "PodMonitor", "PrometheusRule")
        or d["metadata"]["name"] == "topoalloc-dashboard"
    ]
    try:
        for crd in CRDS:
            cluster.cp.kubectl("apply", "--server-side", "-f", str(crd))
        for name in CRD_NAMES:
            cluster.cp.kubectl("wait", "--for=condition=Established", f"crd/{name}.monitoring.coreos.com")
        wait_until(lambda: served(cluster), timeout=30, what="monitoring.coreos.com/v1 served")
        rendered = install_dry_run(cluster)
        assert rendered.returncode == 0, rendered
        kinds = {d["kind"] for d in yaml.safe_load_all(rendered.stdout) if d}
        assert {"ServiceMonitor", "PodMonitor", "PrometheusRule"} <= kinds
        cluster.cp.kubectl(
            "apply", "--server-side", "--field-manager=test", "-f", "-", input=yaml.safe_dump_all(docs)
        )
        rule = cluster.cp.admin.get(f"{API}/prometheusrules/topoalloc")
        alerts = [r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]]
        assert alerts == [a["alert"] for a in monitoring.alerts()]  # nothing pruned on the way
        assert rule["spec"] == next(d for d in docs if d["kind"] == "PrometheusRule")["spec"]
        for kind, name in (("servicemonitors", "topoalloc-allocator"), ("podmonitors", "topoalloc-agent")):
            stored = cluster.cp.admin.get(f"{API}/{kind}/{name}")
            assert stored["spec"] == next(d for d in docs if d["metadata"]["name"] == name)["spec"]
        broken = next(d for d in docs if d["kind"] == "PrometheusRule")
        broken["metadata"]["name"] = "topoalloc-broken"
        broken["spec"]["groups"][0]["rules"][0]["for"] = "two minutes"
        bad = cluster.cp.kubectl(
            "apply", "--server-side", "--dry-run=server", "-f", "-", input=yaml.safe_dump(broken), check=False
        )
        assert bad.returncode != 0 and "spec.groups[0].rules[0].for" in bad.stderr
    finally:
        cluster.cp.kubectl(
            "delete", "--ignore-not-found", "-f", "-", input=yaml.safe_dump_all(docs), check=False
        )
        for crd in CRDS:
            cluster.cp.kubectl("delete", "--ignore-not-found", "-f", str(crd), check=False)


def _extender_mode(cluster: ClusterEnv, ns: str) -> tuple[dict[str, float], dict[str, float]]:
    """A 2-GPU pod bound through kube-scheduler's extender calls: the leader's and the agent's metrics."""
    agent = cluster.add_node(EXTENDER_NODE, "dgx-h100", gpus=8)
    assert agent is not None
    try:
        cluster.wait_device(EXTENDER_NODE)
        cluster.create_pod(
            ns, gpu_pod("ext-pair", gpus=2, node_selector={"kubernetes.io/hostname": EXTENDER_NODE})
        )
        cluster.wait_bound(ns, "ext-pair")
        found = wait_until(
            lambda: (
                (m := allocator_metrics(cluster)).get(
                    'topoalloc_extender_requests_total{result="ok",verb="bind"}'
                )
                and m
            ),
            timeout=30,
            what="the extender's bind counted",
        )
        return found, agent_metrics(agent.process)
    finally:
        cluster.delete_pods(ns)
        cluster.remove_node(EXTENDER_NODE)


def test_every_metric_the_alerts_and_dashboard_name_is_emitted(
    cluster: ClusterEnv, ns: str, tmp_path: Path
) -> None:
    extender, extender_agent = _extender_mode(cluster, ns)
    config = tmp_path / "allocator.yaml"
    config.write_text(yaml.safe_dump({"defrag": {"enabled": True, "dryRun": True, "interval": 1}}))
    with placement_mode(cluster, NODES) as plugin_nodes:
        leader = cluster.leader()
        leader.process.kill()
        cluster.start_allocator(
            leader.identity, extra_args=(*cluster.allocator_args(), "--config", str(config))
        )
        cluster.replicas[leader.identity].wait_ready()
        wait_until(lambda: cluster.leader().health("/readyz")[0] == 200, timeout=60, what="a ready leader")
        cluster.create_pod(ns, gpu_pod("pair", gpus=2))
        cluster.wait_bound(ns, "pair")
        pg = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": "big"},
              "spec": {"minMember": 2}}  # fmt: skip
        cluster.cp.admin.post(PG.format(ns=ns), pg)
        for name in ("big-0", "big-1"):  # 2 x 8 GPUs: 14 are free
            cluster.create_pod(ns, gpu_pod(name, gpus=8, labels={GROUP_LABEL: "big"}))

        def waiting() -> dict[str, float] | None:
            m = allocator_metrics(cluster)
            gated = sum(v for k, v in m.items() if k.startswith("topoalloc_gated_pods{"))
            gangs = sum(v for k, v in m.items() if k.startswith("topoalloc_gangs_waiting{"))
            return (
                m if gated >= 2 and gangs >= 1 and m.get('topoalloc_multi_gpu_pods{link="nvlink"}') else None
            )

        placement = wait_until(waiting, timeout=60, what="the gang waiting and the pair counted")
        agent = agent_metrics(next(iter(plugin_nodes.values())).agent)
    emitted = names(extender) | names(placement) | names(extender_agent) | names(agent)
    used = monitoring.used_names()
    missing = {name: sorted(where) for name, where in used.items() if name not in emitted}
    assert not missing, f"named by the rules or dashboard, not emitted: {missing}"
    # what the workload did shows in them: the pair on one NVLink domain, 2 of 16 GPUs taken
    assert placement['topoalloc_multi_gpu_pods{link="nvlink"}'] == 1
    assert placement['topoalloc_pool_gpus{pool="none",state="allocated"}'] == 2
    assert placement['topoalloc_pool_gpus_stranded{pool="none"}'] == 6
    assert agent['topoalloc_agent_devices{health="healthy",type="gpu"}'] == 8
    assert placement["topoalloc_leader{}"] == 1
