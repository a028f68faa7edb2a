"""Scenario: defragmentation on the real control plane. Four 8-GPU nodes each run two 1-GPU
low-priority pods of a Deployment (kube-controller-manager's Deployment and ReplicaSet controllers
create them and their replacements), and a high-priority gang of one 8-GPU pod waits (gated by the
allocator's webhook; gang preemption off, so only defragmentation makes room). A dry run reports
the plan and evicts nothing (and `topoalloc defrag` shows the same plan); enabled, it reserves the
targets, evicts the fewest pods, the Deployment's replacements land on the reserved rooms and the
gang binds, and an allocator killed mid-migration loses nothing and moves nothing twice; pods a
budget protects and bare pods are never moved; a Deployment's maxUnavailable caps its moves.

No kubelet runs: an evicted pod stays Terminating until the test, standing in for kubelet,
deletes it with grace period 0 (`finish`)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from apis import keys
from apis.reservation_pod import RESERVATION_ALLOCATED
from tests.cluster.harness import ClusterEnv, gpu_pod, ready_nodes
from tests.support.cluster_product import SYSTEM_NAMESPACE, topoalloc_argv
from tests.support.controlplane import ApiStatus, wait_until

POOL = {"topoalloc.test/pool": "defrag"}
NODES = ("df-0", "df-1", "df-2", "df-3")
RESERVATIONS = "/apis/scheduling.koordinator.sh/v1alpha1/reservations"
REPORT = "topoalloc-defrag-report"


@pytest.fixture(scope="module", autouse=True)
def nodes(cluster: ClusterEnv) -> Iterator[None]:
    with ready_nodes(cluster, dict.fromkeys(NODES, POOL)):
        yield
    restart_allocator(cluster, None)  # the plain allocator for the modules after this one


@pytest.fixture(autouse=True)
def cleanup(cluster: ClusterEnv, ns: str) -> Iterator[None]:
    """The Deployment, its ReplicaSet and pods, and the rooms made for them, gone after each test
    (the Deployment first: without kubelet its controllers would keep the namespace's pods alive)."""
    yield
    apps = f"/apis/apps/v1/namespaces/{ns}"
    for path in (f"{apps}/deployments", f"{apps}/replicasets"):
        with contextlib.suppress(ApiStatus):
            cluster.cp.admin.request("DELETE", path, query={"propagationPolicy": "Orphan"})
    cluster.delete_pods(ns)
    for room in moves(cluster, ns):
        with contextlib.suppress(ApiStatus):
            cluster.cp.admin.delete(f"{RESERVATIONS}/{room['metadata']['name']}")


def restart_allocator(cluster: ClusterEnv, defrag: dict[str, Any] | None) -> None:
    """The leader killed and started again, with `defrag` settings (gang preemption off, so the
    waiting gang evicts nothing itself) or with none."""
    extra: tuple[str, ...] = ()
    if defrag is not None:
        path = cluster.workdir / "defrag-config.yaml"
        path.write_text(yaml.safe_dump({"gang": {"preemption": False}, "defrag": defrag}))
        extra = ("--config", str(path))
    leader = cluster.leader()
    leader.process.kill()
    cluster.start_allocator(leader.identity, extra_args=extra).wait_ready()
    wait_until(lambda: cluster.leader().health("/readyz")[0] == 200, timeout=60, what="a ready leader")


def settings(**more: Any) -> dict[str, Any]:
    base = {"enabled": True, "interval": 1, "minWait": 0, "maxMigratingPerWorkload": 2}
    return {**base, **more}


def priorities(cluster: ClusterEnv, ns: str) -> None:
    for name, value in ((f"{ns}-low", 10), (f"{ns}-high", 1000)):
        cluster.cp.admin.post(
            "/apis/scheduling.k8s.io/v1/priorityclasses", {"metadata": {"name": name}, "value": value}
        )


def cordon(cluster: ClusterEnv, *open_nodes: str) -> None:
    """Every node of the pool unschedulable but `open_nodes`."""
    for node in NODES:
        closed = {"unschedulable": True} if node not in open_nodes else {"unschedulable": None}
        cluster.cp.admin.merge_patch(f"/api/v1/nodes/{node}", {"spec": closed})


def deployment(ns: str, *, max_unavailable: int | str = "25%") -> dict[str, Any]:
    template = gpu_pod("x", gpus=1, labels={"app": "web"}, node_selector=POOL)
    template["spec"]["priorityClassName"] = f"{ns}-low"
    template["metadata"] = {"labels": {"app": "web"}}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": "web"}},
            "strategy": {"rollingUpdate": {"maxUnavailable": max_unavailable, "maxSurge": 1}},
            "template": template,
        },
    }


def web_pods(cluster: ClusterEnv, ns: str) -> list[dict[str, Any]]:
    got = cluster.cp.admin.get(f"/api/v1/namespaces/{ns}/pods", labelSelector="app=web")
    return list(got["items"])


def two_per_node(cluster: ClusterEnv, ns: str, **kwargs: Any) -> dict[str, str]:
    """The Deployment's 8 pods, two on each node (the allocator would pack them onto one: each
    node is the only one open while its two are placed). Returns pod name -> node."""
    path = f"/apis/apps/v1/namespaces/{ns}/deployments"
    cluster.cp.admin.post(path, deployment(ns, **kwargs))
    try:
        for i, node in enumerate(NODES):
            cordon(cluster, node)
            cluster.cp.admin.merge_patch(f"{path}/web", {"spec": {"replicas": 2 * (i + 1)}})

            def bound(count: int = 2 * (i + 1)) -> bool:
                pods = web_pods(cluster, ns)
                return len(pods) == count and all(p["spec"].get("nodeName") for p in pods)

            wait_until(bound, timeout=90, what=f"{2 * (i + 1)} web pods bound")
    finally:
        cordon(cluster, *NODES)  # every node open again
    placed = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in web_pods(cluster, ns)}
    assert sorted(placed.values()) == sorted(NODES * 2)
    return placed


def gang(cluster: ClusterEnv, ns: str) -> None:
    """A PodGroup of one 8-GPU pod of the high priority: it waits (no node has 8 GPUs free)."""
    group = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": "train"}}
    cluster.cp.admin.post(
        f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups", {**group, "spec": {"minMember": 1}}
    )
    pod = gpu_pod("train-0", gpus=8, labels={keys.POD_GROUP_LABEL: "train"}, node_selector=POOL)
    pod["spec"]["priorityClassName"] = f"{ns}-high"
    cluster.create_pod(ns, pod)


def finish(cluster: ClusterEnv, ns: str, evicted: set[str]) -> None:
    """Kubelet's part: a pod being deleted (evicted) goes, its containers stopped."""
    for pod in web_pods(cluster, ns):
        if pod["metadata"].get("deletionTimestamp"):
            name = pod["metadata"]["name"]
            evicted.add(name)
            with contextlib.suppress(ApiStatus):
                cluster.cp.admin.delete(f"/api/v1/namespaces/{ns}/pods/{name}", gracePeriodSeconds=0)


def moves(cluster: ClusterEnv, ns: str) -> list[dict[str, Any]]:
    """The Reservations the migration controller made for this namespace's pods."""
    items = cluster.cp.admin.get(RESERVATIONS, labelSelector="topoalloc.io/defrag=true")["items"]
    return [r for r in items if r["metadata"]["annotations"]["topoalloc.io/defrag-pod"].startswith(ns + "/")]


def terminating_pods(cluster: ClusterEnv, ns: str) -> list[dict[str, Any]]:
    return [p for p in web_pods(cluster, ns) if p["metadata"].get("deletionTimestamp")]


def terminating(cluster: ClusterEnv, ns: str) -> list[str]:
    return [p["metadata"]["name"] for p in terminating_pods(cluster, ns)]


def reasons(cluster: ClusterEnv, ns: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in cluster.events(ns) if e.get("reason") == reason]


def report(cluster: ClusterEnv) -> dict[str, Any] | None:
    try:
        got = cluster.cp.admin.get(f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/configmaps/{REPORT}")
    except ApiStatus:
        return None
    return dict(json.loads(got["data"]["plan.json"]))


def cli_plan(cluster: ClusterEnv) -> dict[str, Any]:
    argv = topoalloc_argv("defrag", "--kubeconfig", str(cluster.cp.admin_kubeconfig), "--min-wait", "0")
    ran = subprocess.run([*argv, "--explain", "-o", "json"], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    return dict(json.loads(ran.stdout))


def test_a_dry_run_reports_the_plan_and_evicts_nothing(cluster: ClusterEnv, ns: str) -> None:
    priorities(cluster, ns)
    placed = two_per_node(cluster, ns)
    restart_allocator(cluster, settings(dryRun=True, reportConfigMap=REPORT))
    gang(cluster, ns)
    waiter = f"gang {ns}/train"

    def planned() -> dict[str, Any] | None:
        got = report(cluster)
        return got if got and any(u["waiter"] == waiter for u in got["unblocked"]) else None

    plan = wait_until(planned, timeout=90, what="the dry run's report")
    sources = {m["from"] for m in plan["moves"]}
    assert len(plan["moves"]) == 2 and len(sources) == 1  # the fewest: one node's two pods
    assert plan["largestFreeBlock"] == {"before": 6, "after": 8}
    wait_until(
        lambda: len(reasons(cluster, ns, "DefragPlanned")) >= 2, timeout=30, what="DefragPlanned Events"
    )
    # `topoalloc defrag` reads the same cluster and shows the same plan.
    shown = cli_plan(cluster)
    assert {(m["pod"], m["from"]) for m in shown["plan"]["moves"]} == {
        (m["pod"], m["from"]) for m in plan["moves"]
    }
    assert {n["node"]: n["freeGPUs"] for n in shown["nodes"] if n["node"] in NODES} == dict.fromkeys(NODES, 6)
    [explained] = [w for w in shown["explain"] if w["waiter"] == waiter]
    assert all(p["movable"] for p in explained["pods"] if p["pod"].startswith(ns + "/"))
    # Nothing reserved, nothing evicted, the gang still waiting.
    assert moves(cluster, ns) == [] and terminating(cluster, ns) == []
    assert {p["metadata"]["name"] for p in web_pods(cluster, ns)} == set(placed)
    assert not cluster.pod(ns, "train-0")["spec"].get("nodeName")


def test_moves_reserve_then_evict_survive_a_restart_and_the_gang_binds(cluster: ClusterEnv, ns: str) -> None:
    priorities(cluster, ns)
    placed = two_per_node(cluster, ns)
    restart_allocator(cluster, settings(dryRun=False))
    gang(cluster, ns)
    made = wait_until(lambda: len(m := moves(cluster, ns)) == 2 and m, timeout=90, what="two moves reserved")
    sources = {r["metadata"]["annotations"]["topoalloc.io/defrag-source"] for r in made}
    targets = {r["spec"]["template"]["spec"]["nodeName"] for r in made}
    assert len(sources) == 1 and not sources & targets
    assert all(r["spec"]["owners"][0]["controller"]["kind"] == "ReplicaSet" for r in made)

    def available() -> bool:
        got = moves(cluster, ns)
        return all((r.get("status") or {}).get("phase") == "Available" for r in got)

    wait_until(available, timeout=60, what="the two rooms Available")
    # Mid-migration (the pods evicted or about to be, none gone yet): the allocator is killed.
    restart_allocator(cluster, settings(dryRun=False))
    evicted: set[str] = set()

    def gang_bound() -> bool:
        finish(cluster, ns, evicted)
        return bool(cluster.pod(ns, "train-0")["spec"].get("nodeName"))

    wait_until(gang_bound, timeout=180, what="the gang bound on the freed node")
    [source] = sources
    assert cluster.pod(ns, "train-0")["spec"]["nodeName"] == source
    assert evicted == {name for name, node in placed.items() if node == source}  # those two, no more

    # Nothing twice: still the two Reservations; the replacements landed on their rooms.
    def replaced() -> list[dict[str, Any]] | None:
        new = [p for p in web_pods(cluster, ns) if p["metadata"]["name"] not in placed]
        return new if len(new) == 2 and all(p["spec"].get("nodeName") for p in new) else None

    fresh = wait_until(replaced, timeout=90, what="the two replacements bound")
    assert sorted(p["spec"]["nodeName"] for p in fresh) == sorted(
        r["spec"]["template"]["spec"]["nodeName"] for r in made
    )
    assert all(RESERVATION_ALLOCATED in p["metadata"]["annotations"] for p in fresh)
    assert len(moves(cluster, ns)) == 2
    assert len(reasons(cluster, ns, "DefragEvicted")) == 2


def stuck_in_report(cluster: ClusterEnv, ns: str) -> str:
    waiter = f"gang {ns}/train"
    found = wait_until(
        lambda: next((s for s in (report(cluster) or {}).get("stuck", []) if s["waiter"] == waiter), None),
        timeout=90,
        what="the gang stuck in the dry run's report",
    )
    return str(found["why"])


def nothing_moves(cluster: ClusterEnv, ns: str) -> None:
    """Enabled for a few passes (interval 1 s): no room reserved, no pod evicted, the gang waits."""
    restart_allocator(cluster, settings(dryRun=False))
    time.sleep(5)
    assert moves(cluster, ns) == [] and terminating(cluster, ns) == []
    assert [p for p in web_pods(cluster, ns) if p["metadata"].get("deletionTimestamp")] == []
    assert not cluster.pod(ns, "train-0")["spec"].get("nodeName")


def test_pods_a_budget_protects_are_never_moved(cluster: ClusterEnv, ns: str) -> None:
    priorities(cluster, ns)
    two_per_node(cluster, ns)
    # kube-controller-manager's disruption controller keeps the budget's status (no pod is Ready
    # without kubelet, so it allows no disruption).
    budget = {
        "metadata": {"name": "web"},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "maxUnavailable": 1},
    }
    cluster.cp.admin.post(f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets", budget)
    path = f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/web"
    wait_until(
        lambda: "disruptionsAllowed" in (cluster.cp.admin.get(path).get("status") or {}),
        timeout=60,
        what="the budget's status",
    )
    restart_allocator(cluster, settings(dryRun=True, reportConfigMap=REPORT))
    gang(cluster, ns)
    assert "no pod may move" in stuck_in_report(cluster, ns)
    nothing_moves(cluster, ns)


def test_bare_pods_are_never_moved_unless_allowed(cluster: ClusterEnv, ns: str) -> None:
    priorities(cluster, ns)
    try:  # two on each node, free to go anywhere in the pool (a pinned pod could not move)
        for node in NODES:
            cordon(cluster, node)
            for i in range(2):
                pod = gpu_pod(f"bare-{node}-{i}", gpus=1, labels={"app": "web"}, node_selector=POOL)
                pod["spec"]["priorityClassName"] = f"{ns}-low"
                cluster.create_pod(ns, pod)
            for i in range(2):
                assert cluster.wait_bound(ns, f"bare-{node}-{i}")["spec"]["nodeName"] == node
    finally:
        cordon(cluster, *NODES)
    restart_allocator(cluster, settings(dryRun=True, reportConfigMap=REPORT))
    gang(cluster, ns)
    assert "no pod may move" in stuck_in_report(cluster, ns)
    nothing_moves(cluster, ns)
    # Allowed (EvictAllBarePods): the dry run plans the two moves.
    restart_allocator(cluster, settings(dryRun=True, reportConfigMap=REPORT, allowBarePods=True))
    waiter = f"gang {ns}/train"
    plan = wait_until(
        lambda: (got := report(cluster)) and any(u["waiter"] == waiter for u in got["unblocked"]) and got,
        timeout=90,
        what="the bare pods' moves in the report",
    )
    assert len(plan["moves"]) == 2 and all(m["pod"].startswith(f"{ns}/bare-") for m in plan["moves"])


def test_a_deployments_max_unavailable_caps_its_moves(cluster: ClusterEnv, ns: str) -> None:
    priorities(cluster, ns)
    two_per_node(cluster, ns, max_unavailable=1)
    restart_allocator(cluster, settings(dryRun=False))  # the settings would allow two at once
    gang(cluster, ns)
    held = wait_until(
        lambda: [
            e
            for e in reasons(cluster, ns, "DefragHeld")
            if "Deployment maxUnavailable 1" in e.get("note", e.get("message", ""))
        ],
        timeout=90,
        what="a move held by the Deployment's maxUnavailable",
    )
    assert held and len(moves(cluster, ns)) == 1
