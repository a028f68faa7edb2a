"""Scenario: defragmentation on the real control plane. Four 8-GPU nodes each run two 1-GPU
low-priority pods of a Deployment (kube-controller-manager's Deployment and ReplicaSet controllers
create them and their replacements), and a high-priority gang of one 8-GPU pod waits (gated by the
allocator's webhook; gang preemption off, so only defragmentation makes room). A dry run reports
the plan and evicts nothing (and `topoalloc defrag` shows the same plan); enabled, it reserves the
targets, evicts the fewest pods, the Deployment's replacements land on the reserved rooms and the
gang binds, and an allocator killed mid-migration loses nothing and moves nothing twice; pods a
budget protects and bare pods are never moved; a Deployment's maxUnavailable caps its moves. It
keeps its limits while replacements take seconds to be Ready and one cannot be scheduled at once:
the Deployment never has fewer than replicas - maxUnavailable pods available, and never more moves
are in flight than maxMigrating (both watched the whole time, every version).

No kubelet runs: where a test needs one, `ReadyKubelet` (defrag_kubelet.py) reports pods Running
and Ready once bound (replacements a few seconds later, as a real kubelet takes) and lets an
evicted pod go at once; elsewhere an evicted pod stays Terminating until the test deletes it with
grace period 0, and no pod is Ready."""

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
from tests.cluster.defrag_kubelet import Availability, MoveWatch, ReadyKubelet
from tests.cluster.defrag_kubelet import close as close_all
from tests.cluster.harness import ClusterEnv, gpu_pod, metrics, ready_nodes
from tests.support.cluster_product import SYSTEM_NAMESPACE, topoalloc_argv
from tests.support.controlplane import ApiStatus, wait_until

POOL = {"topoalloc.test/pool": "defrag"}
NODES = ("df-0", "df-1", "df-2", "df-3")
RESERVATIONS = "/apis/scheduling.koordinator.sh/v1alpha1/reservations"
REPORT = "topoalloc-defrag-report"
TRAIN_ONLY = "topoalloc.test/train-only"  # a taint the gangs tolerate, the Deployment's pods not
REPLACEMENT_READY = 5.0  # seconds from a replacement's binding to its Ready, as a real kubelet takes


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


@pytest.fixture
def kubelet(cluster: ClusterEnv, ns: str) -> Iterator[ReadyKubelet]:
    """Kubelet's part for the namespace's pods: Ready at once while the scene is set up (a test
    sets `delay` for what binds next), evicted pods gone at once."""
    stand_in = ReadyKubelet(cluster.cp, ns)
    yield stand_in
    stand_in.close()


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


def taint_for_training(cluster: ClusterEnv, node: str, on: bool) -> None:
    taints = [{"key": TRAIN_ONLY, "value": "true", "effect": "NoSchedule"}] if on else None
    cluster.cp.admin.merge_patch(f"/api/v1/nodes/{node}", {"spec": {"taints": taints}})


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


def gang(cluster: ClusterEnv, ns: str, name: str = "train") -> None:
    """A PodGroup of one 8-GPU pod (`name`-0) of the high priority: it waits (no node has 8 GPUs
    free)."""
    group = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": name}}
    cluster.cp.admin.post(
        f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups", {**group, "spec": {"minMember": 1}}
    )
    pod = gpu_pod(f"{name}-0", gpus=8, labels={keys.POD_GROUP_LABEL: name}, node_selector=POOL)
    pod["spec"]["tolerations"] = [{"key": TRAIN_ONLY, "operator": "Exists", "effect": "NoSchedule"}]
    pod["spec"]["priorityClassName"] = f"{ns}-high"
    cluster.create_pod(ns, pod)


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


def test_moves_reserve_then_evict_survive_a_restart_and_the_gang_binds(
    cluster: ClusterEnv, ns: str, kubelet: ReadyKubelet
) -> None:
    priorities(cluster, ns)
    placed = two_per_node(cluster, ns)
    kubelet.delay = REPLACEMENT_READY
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
    # Mid-migration (the pods evicted or about to be, their replacements not Ready): the allocator
    # is killed.
    restart_allocator(cluster, settings(dryRun=False))

    def gang_bound() -> bool:
        return bool(cluster.pod(ns, "train-0")["spec"].get("nodeName"))

    wait_until(gang_bound, timeout=180, what="the gang bound on the freed node")
    [source] = sources
    assert cluster.pod(ns, "train-0")["spec"]["nodeName"] == source
    assert kubelet.evicted == {name for name, node in placed.items() if node == source}  # those two, no more

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
    # One Event per eviction at most. An Event still queued when the allocator is killed is lost
    # (Events are best effort), so a kill landing just after an eviction leaves one.
    told = [e["involvedObject"]["name"] for e in reasons(cluster, ns, "DefragEvicted")]
    assert told and len(told) == len(set(told)) and set(told) <= kubelet.evicted, told


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


def test_a_deployments_max_unavailable_caps_its_moves(
    cluster: ClusterEnv, ns: str, kubelet: ReadyKubelet
) -> None:
    priorities(cluster, ns)
    two_per_node(cluster, ns, max_unavailable=1)
    kubelet.delay = REPLACEMENT_READY
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


def available(cluster: ClusterEnv, ns: str) -> dict[str, Any]:
    """The Deployment, once all 8 of its pods are available."""
    path = f"/apis/apps/v1/namespaces/{ns}/deployments/web"
    return wait_until(
        lambda: (d := cluster.cp.admin.get(path)).get("status", {}).get("availableReplicas") == 8 and d,
        timeout=60,
        what="the Deployment's 8 pods available",
    )


def defrag_passes(cluster: ClusterEnv) -> float:
    return metrics(cluster.leader()).get('topoalloc_controller_passes_total{controller="defrag"}', 0.0)


def test_moves_never_take_a_deployment_below_its_max_unavailable(
    cluster: ClusterEnv, ns: str, kubelet: ReadyKubelet
) -> None:
    """Two gangs wait, four moves make their room; maxUnavailable 25% of 8 lets 2 pods be down
    at once. A move ends when its replacement is Ready (seconds after binding), so the next two
    start only then: availableReplicas never below 6, in every version the Deployment had."""
    priorities(cluster, ns)
    two_per_node(cluster, ns)
    start = available(cluster, ns)["metadata"]["resourceVersion"]
    kubelet.delay = REPLACEMENT_READY
    seen = Availability(cluster.cp, ns, "web", start)
    try:
        # Only the Deployment's own limit holds the moves back (the settings would allow four).
        four = {"maxMigrating": 4, "maxMigratingPerNamespace": 4, "maxMigratingPerWorkload": 4}
        restart_allocator(cluster, settings(dryRun=False, **four))
        gang(cluster, ns, "train-a")
        gang(cluster, ns, "train-b")
        for name in ("train-a-0", "train-b-0"):
            cluster.wait_bound(ns, name, timeout=240)
        wait_until(lambda: len(kubelet.evicted) >= 4 and seen.reported(), timeout=30, what="four pods moved")
        wait_until(lambda: min(seen.reported()[-1:] or [0]) == 8, timeout=60, what="the replacements Ready")
    finally:
        close_all(seen)
    assert len(kubelet.evicted) == 4 and len(moves(cluster, ns)) == 4
    reported = seen.reported()
    assert min(reported) >= 6, f"availableReplicas fell to {min(reported)} (versions: {reported})"


def test_no_more_moves_in_flight_than_max_migrating_while_a_replacement_waits(
    cluster: ClusterEnv, ns: str, kubelet: ReadyKubelet
) -> None:
    """maxMigrating 1. The rooms' nodes are cordoned and the node being cleared takes only the
    gang (a taint it tolerates): the first replacement cannot be scheduled until the nodes are
    opened again, and is Ready seconds after. The second move starts only then (a move is not over
    when its pod is gone): never two in flight."""
    priorities(cluster, ns)
    # df-3's pods started last: the cheapest to move (fewest GPU-hours lost), so the gang goes there.
    kubelet.age = {node: 3600.0 for node in NODES if node != "df-3"}
    placed = two_per_node(cluster, ns)
    available(cluster, ns)
    kubelet.delay = REPLACEMENT_READY
    cordon(cluster, "df-3")  # the rooms' nodes closed, and df-3 only for the gang: a replacement waits
    taint_for_training(cluster, "df-3", True)
    watch = MoveWatch(cluster.cp, ns)
    try:
        restart_allocator(cluster, settings(dryRun=False, maxMigrating=1))
        gang(cluster, ns)
        waiting = wait_until(
            lambda: [
                p
                for p in web_pods(cluster, ns)
                if p["metadata"]["name"] not in placed and not p["spec"].get("nodeName")
            ],
            timeout=90,
            what="the first replacement waiting for its node",
        )
        # Two more passes of the controller while it waits: the second move stays held.
        passes = defrag_passes(cluster)
        wait_until(
            lambda: watch.most() > 1 or defrag_passes(cluster) >= passes + 2,
            timeout=30,
            what="two more passes",
        )
        assert watch.most() == 1, f"{watch.most()} moves in flight at once"
        assert watch.made() == 1 and len(kubelet.evicted) == 1
        assert not cluster.pod(ns, waiting[0]["metadata"]["name"])["spec"].get("nodeName")
        held = [
            e
            for e in reasons(cluster, ns, "DefragHeld")
            if "maxMigrating 1" in e.get("note", e.get("message", ""))
        ]
        assert held
        cordon(cluster, *NODES)  # open again: the replacement binds, is Ready, the second move goes
        assert cluster.wait_bound(ns, "train-0", timeout=180)["spec"]["nodeName"] == "df-3"
    finally:
        cordon(cluster, *NODES)
        taint_for_training(cluster, "df-3", False)
        close_all(watch)
    assert kubelet.evicted == {name for name, node in placed.items() if node == "df-3"}
    assert watch.made() == 2 and watch.most() == 1
