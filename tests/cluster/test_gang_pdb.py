"""Scenario (issue 32): a high-priority gang of two 8-GPU members needs room. The cheapest victims
are two 8-GPU low-priority pods on rack "guarded", protected by a PodDisruptionBudget with
maxUnavailable 0 (kube-controller-manager's disruption controller writes its status: no
disruption allowed); rack "open" is full of unprotected low-priority 1-GPU pods (sixteen victims).

* The allocator watches the budgets: it evicts the sixteen unprotected pods, never asks to evict a
  protected one, and the gang binds on rack "open" well within the preemption timeout.
* An allocator that may not read budgets (its ClusterRole from before they were watched) takes the
  two protected pods, the Eviction API refuses them (429), and it re-plans around them on its next
  pass: the gang binds on rack "open" just the same, and the PodGroup's Preempting condition says
  it went around the refused pods.

No kubelet runs here: evicted pods are deleted with grace 0 by the test, as kubelet would finish them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from apis import keys
from tests.cluster.harness import RACK, ClusterEnv, gpu_pod, racked_dgx_nodes
from tests.support.controlplane import REPO, wait_until

NODES = {"pdb-g1": "guarded", "pdb-g2": "guarded", "pdb-o1": "open", "pdb-o2": "open"}
ROLE = "/apis/rbac.authorization.k8s.io/v1/clusterroles/topoalloc-allocator"
PODGROUPS = "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups"
BIND_WITHIN = 150.0  # seconds; the preemption timeout is 300


@pytest.fixture(scope="module")
def nodes(cluster: ClusterEnv) -> Iterator[dict[str, str]]:
    yield from racked_dgx_nodes(cluster, NODES)


def _restart_allocators(cluster: ClusterEnv) -> None:
    """Every replica stopped, then one started and leading (it reads RBAC afresh at its LISTs)."""
    for replica in cluster.replicas.values():
        replica.process.stop()
    cluster.start_allocator("alloc-a").wait_ready("/readyz")


@pytest.fixture
def blind(cluster: ClusterEnv) -> Iterator[None]:
    """The allocator's ClusterRole without the PodDisruptionBudget rule, as before issue 32; the
    deployed one is put back afterwards."""
    role = cluster.cp.admin.get(ROLE)
    role["rules"] = [r for r in role["rules"] if "poddisruptionbudgets" not in r["resources"]]
    cluster.cp.admin.put(ROLE, role)
    _restart_allocators(cluster)
    try:
        yield
    finally:
        cluster.cp.kubectl("apply", "-f", str(REPO / "deploy" / "allocator" / "rbac.yaml"))
        _restart_allocators(cluster)


def _scene(cluster: ClusterEnv, ns: str) -> tuple[list[str], list[str]]:
    """The protected pods (a ReplicaSet's two 8-GPU pods, one per guarded node: maxUnavailable
    needs their controller's scale; reported running and ready) and the unprotected fillers,
    bound, and the budget counted: both healthy, no disruption allowed."""
    admin = cluster.cp.admin
    for name, value in ((f"{ns}-low", 10), (f"{ns}-high", 1000)):
        admin.post("/apis/scheduling.k8s.io/v1/priorityclasses", {"metadata": {"name": name}, "value": value})
    template = gpu_pod("keep", gpus=8, labels={"app": "keep"}, node_selector={RACK: "guarded"})
    template["spec"]["priorityClassName"] = f"{ns}-low"
    replicaset = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": "keep"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "keep"}},
            "template": {"metadata": {"labels": {"app": "keep"}}, "spec": template["spec"]},
        },
    }
    admin.post(f"/apis/apps/v1/namespaces/{ns}/replicasets", replicaset)
    fillers = []
    for node, rack in NODES.items():
        for i in range(8 if rack == "open" else 0):
            pod = gpu_pod(f"f-{node}-{i}", gpus=1, node_selector={"kubernetes.io/hostname": node})
            pod["spec"]["priorityClassName"] = f"{ns}-low"
            cluster.create_pod(ns, pod)
            fillers.append(pod["metadata"]["name"])

    def guarded_bound() -> list[str] | None:
        pods = admin.get(f"/api/v1/namespaces/{ns}/pods", labelSelector="app=keep")["items"]
        names = [p["metadata"]["name"] for p in pods if p["spec"].get("nodeName")]
        return names if len(names) == 2 else None

    guarded = wait_until(guarded_bound, timeout=120, what="the ReplicaSet's pods bound")
    for name in fillers:
        cluster.wait_bound(ns, name, timeout=120)
    for name in guarded:  # running and ready, as kubelet would report them (the Eviction API
        _running(cluster, ns, name)  # evicts a Pending pod whatever its budget says)
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "keep"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "keep"}}},
    }
    admin.post(f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets", budget)

    def counted() -> bool:
        status = admin.get(f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/keep").get("status") or {}
        healthy = status.get("currentHealthy") == status.get("desiredHealthy") == 2
        return status.get("observedGeneration", 0) >= 1 and healthy and status.get("disruptionsAllowed") == 0

    wait_until(counted, timeout=60, what="the disruption controller counting the budget")
    return guarded, fillers


def _running(cluster: ClusterEnv, ns: str, name: str) -> None:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    ready = {"type": "Ready", "status": "True", "lastTransitionTime": now}
    status = {"phase": "Running", "startTime": now, "conditions": [ready]}
    cluster.cp.admin.merge_patch(f"/api/v1/namespaces/{ns}/pods/{name}/status", {"status": status})


def _clean_up(cluster: ClusterEnv, ns: str) -> None:
    """The ReplicaSet goes first (its pods are left to the namespace's grace-0 delete)."""
    path = f"/apis/apps/v1/namespaces/{ns}/replicasets/keep"
    cluster.cp.admin.request("DELETE", path, query={"propagationPolicy": "Orphan"})


def _gang(cluster: ClusterEnv, ns: str) -> str:
    """The PodGroup and its two members; the PodGroup's first resourceVersion (a watch from it sees
    every status the allocator writes)."""
    group = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": "train"}}
    created = cluster.cp.admin.post(PODGROUPS.format(ns=ns), {**group, "spec": {"minMember": 2}})
    for i in range(2):
        pod = gpu_pod(f"train{i}", gpus=8, labels={keys.POD_GROUP_LABEL: "train"})
        pod["spec"]["priorityClassName"] = f"{ns}-high"
        cluster.create_pod(ns, pod)
    return str(created["metadata"]["resourceVersion"])


class PreemptingLog:
    """Every version of the PodGroup's Preempting condition since `since`, from an API watch. The
    re-plan's condition holds for a moment only (until its victims are gone), so a poll can miss
    it; and `kubectl get -w` with a {range} JSONPath prints its first object only
    (kubernetes/kubectl#913)."""

    def __init__(self, cluster: ClusterEnv, ns: str, since: str) -> None:
        self.versions: list[tuple[str, dict[str, Any]]] = []  # (resourceVersion, the condition)
        self.stop = threading.Event()
        cluster.cp.watch(
            PODGROUPS.format(ns=ns), self._seen, self.stop, "podgroup-watch", resource_version=since
        )

    def _seen(self, event: dict[str, Any]) -> None:
        obj = event.get("object") or {}
        if event.get("type") in ("ADDED", "MODIFIED") and obj["metadata"]["name"] == "train":
            self.versions.append((obj["metadata"]["resourceVersion"], _preempting(obj) or {}))

    def said(self) -> list[str]:
        """The messages of the condition while True, each once, in the order written."""
        out: list[str] = []
        for _, c in list(self.versions):
            if c.get("status") == "True" and c["message"] not in out:
                out.append(c["message"])
        return out

    def has(self, rv: str) -> bool:
        return any(seen == rv for seen, _ in list(self.versions))


def _bind_as_kubelet_would(
    cluster: ClusterEnv, ns: str, pods: list[str], since: str
) -> tuple[set[str], float, list[str]]:
    """Until both members are bound, finishing whatever is terminating (grace 0, once the PodGroup
    said it is preempting: kubelet takes a moment too); the pods that went, how long the gang took,
    and the Preempting condition's messages since `since`."""
    admin = cluster.cp.admin
    evicted: set[str] = set()
    log = PreemptingLog(cluster, ns, since)
    started = time.monotonic()

    def members_bound() -> bool:
        if log.said() or time.monotonic() - started > 20:
            cluster.finish_terminating(ns, pods, evicted)
        return all(cluster.pod(ns, f"train{i}")["spec"].get("nodeName") for i in range(2))

    try:
        wait_until(members_bound, timeout=BIND_WITHIN, what="the gang bound after preemption")
        took = time.monotonic() - started
        latest = admin.get(PODGROUPS.format(ns=ns) + "/train")["metadata"]["resourceVersion"]
        wait_until(lambda: log.has(latest), timeout=30, what="the PodGroup watch reaching its latest version")
    finally:
        log.stop.set()
    return evicted, took, log.said()


def _landed(cluster: ClusterEnv, ns: str) -> set[str]:
    return {cluster.pod(ns, f"train{i}")["spec"]["nodeName"] for i in range(2)}


def _preempting(podgroup: dict[str, Any]) -> dict[str, Any] | None:
    conditions = (podgroup.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "Preempting"), None)


def test_the_gang_goes_around_the_pods_a_budget_protects(
    cluster: ClusterEnv, ns: str, nodes: dict[str, str]
) -> None:
    guarded, fillers = _scene(cluster, ns)
    since = _gang(cluster, ns)
    evicted, took, said = _bind_as_kubelet_would(cluster, ns, guarded + fillers, since)
    assert {nodes[n] for n in _landed(cluster, ns)} == {"open"} and len(_landed(cluster, ns)) == 2
    assert evicted == set(fillers)  # the sixteen unprotected pods, nothing protected
    assert said == ["16 lower-priority pod(s) evicted for the gang"]
    for name in guarded:
        assert not cluster.pod(ns, name)["metadata"].get("deletionTimestamp")
    notes = [e.get("message") or "" for e in cluster.events(ns)]
    assert not any("refused" in n for n in notes), notes
    _clean_up(cluster, ns)
    print(f"gang bound {took:.1f}s after creation, around the budget")


def test_a_refused_eviction_re_plans_around_the_protected_pods(
    cluster: ClusterEnv, ns: str, nodes: dict[str, str], blind: None
) -> None:
    guarded, fillers = _scene(cluster, ns)
    since = _gang(cluster, ns)
    evicted, took, said = _bind_as_kubelet_would(cluster, ns, guarded + fillers, since)
    assert {nodes[n] for n in _landed(cluster, ns)} == {"open"} and len(_landed(cluster, ns)) == 2
    assert evicted == set(fillers)  # the protected pods stayed: their evictions were refused
    for name in guarded:
        assert not cluster.pod(ns, name)["metadata"].get("deletionTimestamp")
    events = cluster.events(ns)
    replanned = [
        e.get("message") or ""
        for e in events
        if e.get("reason") == "GangPreempting" and "re-planned" in (e.get("message") or "")
    ]
    assert replanned and "eviction of 2 pod(s) refused" in replanned[0], [e.get("message") for e in events]
    refused = (
        "16 lower-priority pod(s) evicted for the gang; re-planned around 2 pod(s) whose eviction was refused"
    )
    assert said == [
        "2 lower-priority pod(s) evicted for the gang",
        refused,
    ]  # the first plan, then the re-plan
    _clean_up(cluster, ns)
    print(f"gang bound {took:.1f}s after creation, after a refused eviction")
