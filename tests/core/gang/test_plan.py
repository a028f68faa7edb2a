"""The pure gang planner on hand-built clusters: every expected placement below is worked out by
hand from the node sizes, labels and the planner's documented order of preferences."""

from __future__ import annotations

from collections import Counter

from allocator.core.cluster.state import ClusterState
from allocator.core.devices.allocate import Allocation, allocate
from allocator.core.gang.plan import GangPlan, GangPlanSettings, NoPlan, plan_gang
from allocator.core.request.parse import pod_request
from allocator.core.request.pod_request import PodRequest
from tests.core.pods import gpus, pod
from tests.support.machines import dgx_h100_device, l40s_device

RACK = "topoalloc.io/rack"
ZONE = "topology.kubernetes.io/zone"
SETTINGS = GangPlanSettings(topology_keys=(RACK, ZONE))


def node(name: str, labels: dict[str, str] | None = None, cpu: str = "64", pods: str = "110") -> dict:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "status": {"allocatable": {"cpu": cpu, "memory": "512Gi", "pods": pods}},
    }


def cluster(racks: dict[str, str], kind: str = "dgx") -> ClusterState:
    c = ClusterState()
    for name, rack in racks.items():
        c.upsert_node(node(name, {RACK: rack, ZONE: "z1"}))
        c.set_device(dgx_h100_device(name) if kind == "dgx" else l40s_device(name))
    return c


def take_gpus(c: ClusterState, name: str, count: int) -> None:
    """A pod already bound there holding `count` whole GPUs."""
    req = pod_request(pod(gpus(count, cpu="1"), name=f"filler-{name}"))
    got = allocate(c.nodes[name], req)
    assert isinstance(got, Allocation)
    c.assign(req.key, name, got.devices, req.cpu_milli, req.memory)


def workers(count: int, gpu: int = 1, prefix: str = "w", **extra: object) -> list[PodRequest]:
    return [pod_request(pod(gpus(gpu, cpu="1"), name=f"{prefix}{i:02d}", **extra)) for i in range(count)]  # type: ignore[arg-type]


def snapshot(c: ClusterState) -> dict[str, object]:
    return {n: (s.version, sorted(s.pods), s.whole_gpus_free) for n, s in c.nodes.items()}


def per_node(plan: GangPlan) -> Counter[str]:
    return Counter(p.node for p in plan.placements)


def test_sixteen_workers_take_the_two_free_nodes_of_one_rack() -> None:
    # r1: n1 (8 free) + n2 (4 free); r2: n3, n4 (8 free each); r3: n5 (8 free).
    # Fewest nodes is 2 (8 + 8); only r2 has two whole nodes, so the plan is n3 + n4 in r2,
    # although n1 comes first by name and has room.
    c = cluster({"n1": "r1", "n2": "r1", "n3": "r2", "n4": "r2", "n5": "r3"})
    take_gpus(c, "n2", 4)
    plan = plan_gang(c, workers(16), SETTINGS)
    assert isinstance(plan, GangPlan)
    assert plan.nodes == ("n3", "n4") and plan.domain == f"{RACK}=r2"
    assert per_node(plan) == {"n3": 8, "n4": 8}
    assert plan.tier == 100  # each node's 8 GPUs share one NVSwitch domain
    for name in ("n3", "n4"):
        minors = [m for p in plan.placements if p.node == name for m in p.allocation.minors("gpu")]
        assert sorted(minors) == list(range(8))  # every GPU once


def test_fewest_nodes_first_then_the_tightest_fit() -> None:
    # 12 workers: {n1, n2} (8 + 4, rack r1) and {n3, n4} (8 + 8, rack r2) both take 2 nodes of
    # one rack with NVLink; the first-fit-decreasing order takes the largest node (n1, first by
    # name among 8s), then the smallest that holds the remaining 4 (n2), leaving r2 whole.
    c = cluster({"n1": "r1", "n2": "r1", "n3": "r2", "n4": "r2"})
    take_gpus(c, "n2", 4)
    plan = plan_gang(c, workers(12), SETTINGS)
    assert isinstance(plan, GangPlan)
    assert per_node(plan) == {"n1": 8, "n2": 4} and plan.domain == f"{RACK}=r1"


def test_fewer_nodes_beat_one_rack() -> None:
    # 8 workers fit on n3 alone (r2); two nodes of r1 (4 + 4 free) would keep a rack too but
    # need two nodes.
    c = cluster({"n1": "r1", "n2": "r1", "n3": "r2"})
    take_gpus(c, "n1", 4)
    take_gpus(c, "n2", 4)
    plan = plan_gang(c, workers(8), SETTINGS)
    assert isinstance(plan, GangPlan) and plan.nodes == ("n3",)


def test_all_or_nothing_leaves_the_cluster_untouched() -> None:
    # 5 members of 4 GPUs on two 8-GPU nodes: 4 fit, the fifth does not, so nothing is planned.
    c = cluster({"n1": "r1", "n2": "r1"})
    before = snapshot(c)
    got = plan_gang(c, workers(5, gpu=4), SETTINGS)
    assert isinstance(got, NoPlan)
    assert got.placed == 4 and not got.unresolvable
    assert got.message.startswith("only 4 of 5 members fit at once; member default/w04 has no room (2 ")
    assert snapshot(c) == before  # no node changed, not even its version


def test_member_that_fits_nowhere_is_named_with_the_reasons() -> None:
    c = cluster({"n1": "r1"})
    got = plan_gang(c, workers(1, gpu=16), SETTINGS)
    assert isinstance(got, NoPlan) and got.placed == 0
    # more GPUs than the node has: said as that (issue 31)
    assert got.message == "member default/w00 fits on none of 1 node: 1 need 16 GPUs"


def test_nvlink_beats_pcie_for_members_sharing_a_node() -> None:
    # Two 2-GPU members fit on either node alone. On the DGX their 4 GPUs share one NVSwitch
    # domain (tier 100); on the L40S box they are two PCIe-switch pairs on one NUMA node (50).
    c = ClusterState()
    c.upsert_node(node("a-l40s"))
    c.set_device(l40s_device("a-l40s"))
    c.upsert_node(node("z-dgx"))
    c.set_device(dgx_h100_device("z-dgx"))
    plan = plan_gang(c, workers(2, gpu=2), SETTINGS)
    assert isinstance(plan, GangPlan) and plan.nodes == ("z-dgx",) and plan.tier == 100
    only_l40s = plan_gang(c, workers(2, gpu=2), SETTINGS, names=["a-l40s"])
    assert isinstance(only_l40s, GangPlan) and only_l40s.tier == 50


def test_siblings_pull_the_plan_to_their_node_then_their_rack() -> None:
    c = cluster({"n1": "r1", "n2": "r2", "n3": "r2"})
    plan = plan_gang(c, workers(2), SETTINGS, siblings={"n3": 1})
    assert isinstance(plan, GangPlan) and plan.nodes == ("n3",)
    take_gpus(c, "n3", 8)  # the sibling's node is full: its rack is next
    plan = plan_gang(c, workers(2), SETTINGS, siblings={"n3": 1})
    assert isinstance(plan, GangPlan) and plan.nodes == ("n2",)


def test_node_selectors_limit_each_member() -> None:
    c = cluster({"n1": "r1", "n2": "r2"})
    pinned = pod(gpus(1, cpu="1"), name="pinned")
    pinned["spec"]["nodeSelector"] = {RACK: "r2"}
    members = [*workers(2), pod_request(pinned)]
    plan = plan_gang(c, members, SETTINGS)
    assert isinstance(plan, GangPlan) and plan.node_of("default/pinned") == "n2"
    # Fewest nodes: the other two follow it to n2.
    assert plan.nodes == ("n2",)


def test_a_launcher_without_gpus_rides_along() -> None:
    c = cluster({"n1": "r1", "n2": "r1"})
    launcher = pod_request(pod({"cpu": "2"}, name="launcher"))
    plan = plan_gang(c, [launcher, *workers(2, gpu=4)], SETTINGS)
    assert isinstance(plan, GangPlan) and plan.nodes == ("n1",)
    assert plan.placements[0].key == "default/launcher" and not plan.placements[0].allocation.devices.by_type


def test_cpu_and_pod_slots_count_like_kube_scheduler() -> None:
    c = ClusterState()
    c.upsert_node(node("small", cpu="2"))
    c.set_device(dgx_h100_device("small"))
    c.upsert_node(node("big", cpu="64", pods="1"))
    c.set_device(dgx_h100_device("big"))
    # 3 members of 1 cpu: "small" has 2 cpus, "big" one pod slot: 2 + 1.
    plan = plan_gang(c, workers(3), SETTINGS)
    assert isinstance(plan, GangPlan) and per_node(plan) == {"small": 2, "big": 1}
    assert isinstance(plan_gang(c, workers(4), SETTINGS), NoPlan)


def test_invalid_member_fails_the_gang_unresolvably() -> None:
    c = cluster({"n1": "r1"})
    bad = pod_request(pod({"koordinator.sh/gpu-core": "150", "cpu": "1"}, name="bad"))
    got = plan_gang(c, [*workers(1), bad], SETTINGS)
    assert isinstance(got, NoPlan) and got.unresolvable and got.message.startswith("member default/bad: ")


def test_deterministic_whatever_the_member_order() -> None:
    c = cluster({"n1": "r1", "n2": "r2", "n3": "r2", "n4": "r3"})
    members = workers(12, gpu=1)
    one = plan_gang(c, members, SETTINGS)
    two = plan_gang(c, list(reversed(members)), SETTINGS)
    assert isinstance(one, GangPlan) and isinstance(two, GangPlan)
    assert {p.key: (p.node, p.allocation.to_json()) for p in one.placements} == {
        p.key: (p.node, p.allocation.to_json()) for p in two.placements
    }
    assert [p.key for p in two.placements] == [m.key for m in reversed(members)]  # given order kept
