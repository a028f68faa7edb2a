"""Topology levels in the gang planner (allocator/core/gang/levels.py) on hand-built racks of
DGX H100 nodes (8 GPUs each); every expected placement is worked out by hand from which nodes are
free and which leaf/spine each carries."""

from __future__ import annotations

import random
from collections import Counter

from allocator.core.cluster.state import ClusterState
from allocator.core.devices.allocate import Allocation, allocate
from allocator.core.gang.levels import Levels, keep_to_level, levels_of, plan_in_levels, preempt_in_levels
from allocator.core.gang.plan import GangPlan, GangPlanSettings, NoPlan, plan_gang
from allocator.core.gang.preemption import PreemptionPlan
from allocator.core.gang.victims import Candidate
from allocator.core.request.parse import pod_request
from allocator.core.request.pod_request import PodRequest
from apis.topology_constraint import TopologyWish
from apis.topology_profile import HOSTNAME, PRESETS
from tests.core.pods import gpus, pod
from tests.support.machines import dgx_h100_device

LEAF = "network.topology.nvidia.com/leaf"
SPINE = "network.topology.nvidia.com/spine"
PROFILE = PRESETS["topograph-legacy"]
REQUIRED_LEAF = levels_of(PROFILE, TopologyWish(required="leaf"))
PREFERRED_LEAF = levels_of(PROFILE, TopologyWish(preferred=LEAF))
BASE = GangPlanSettings(topology_keys=PROFILE.keys)


def cluster(leafs: dict[str, str], spine: str = "s1") -> ClusterState:
    c = ClusterState()
    for name, leaf in leafs.items():
        labels = {LEAF: leaf, SPINE: spine} if leaf else {}
        c.upsert_node(
            {
                "metadata": {"name": name, "labels": labels},
                "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"}},
            }
        )
        c.set_device(dgx_h100_device(name))
    return c


def take(c: ClusterState, node: str, count: int, key: str = "", priority: int = 0) -> str:
    raw = pod(gpus(count, cpu="1"), name=key or f"filler-{node}")
    raw["spec"]["priority"] = priority
    req = pod_request(raw)
    got = allocate(c.nodes[node], req)
    assert isinstance(got, Allocation)
    c.assign(req.key, node, got.devices, req.cpu_milli, req.memory)
    return req.key


def gang(count: int, gpu: int = 8, priority: int = 100) -> list[PodRequest]:
    out = []
    for i in range(count):
        raw = pod(gpus(gpu, cpu="1"), name=f"w{i}")
        raw["spec"]["priority"] = priority
        out.append(pod_request(raw))
    return out


def nodes_of(plan: GangPlan) -> Counter[str]:
    return Counter(p.node for p in plan.placements)


def test_levels_of_a_wish_in_a_profile() -> None:
    assert (
        Levels(
            ("nvidia.com/gpu.clique", "network.topology.nvidia.com/accelerator", LEAF),
            ("clique", "accelerator", "leaf"),
            True,
        )
        == REQUIRED_LEAF
    )
    assert PREFERRED_LEAF is not None and PREFERRED_LEAF.keys == PROFILE.keys and not PREFERRED_LEAF.required
    # A key the profile does not list is a level of its own; the hostname is the node level.
    assert levels_of(PROFILE, TopologyWish(required="example.com/pod")) == Levels(
        ("example.com/pod",), ("example.com/pod",), True
    )
    assert levels_of(PROFILE, TopologyWish(required=HOSTNAME)) == Levels((HOSTNAME,), ("node",), True)
    assert levels_of(PROFILE, None) is None and levels_of(PROFILE, TopologyWish()) is None
    assert REQUIRED_LEAF is not None and REQUIRED_LEAF.what == f"required leaf ({LEAF})"


def test_a_gang_that_fits_one_node_takes_one_node_whatever_the_level() -> None:
    c = cluster({"n1": "L1", "n2": "L1", "n3": "L2"})
    got = plan_in_levels(c, gang(2, gpu=4), BASE, REQUIRED_LEAF)
    assert isinstance(got, GangPlan) and len(got.nodes) == 1


def test_required_leaf_waits_rather_than_straddle_then_binds_when_a_leaf_frees() -> None:
    # L1: n1 free, n2 full; L2: n3 free, n4 full. Two 8-GPU members fit only on n1 + n3, which
    # straddles the leafs: the planner without levels takes them, a required leaf waits.
    c = cluster({"n1": "L1", "n2": "L1", "n3": "L2", "n4": "L2"})
    take(c, "n2", 8)
    take(c, "n4", 8)
    members = gang(2)
    free = plan_gang(c, members, BASE)
    assert isinstance(free, GangPlan) and free.nodes == ("n1", "n3")
    waiting = plan_in_levels(c, members, BASE, REQUIRED_LEAF)
    assert isinstance(waiting, NoPlan)
    assert waiting.message.startswith(f"required leaf ({LEAF}): no leaf holds all 2 members (tried ")
    assert "L1: " in waiting.message and "L2: " in waiting.message
    # A preferred leaf takes the fewest leafs instead (two here), as the planner without levels.
    spread = plan_in_levels(c, members, BASE, PREFERRED_LEAF)
    assert isinstance(spread, GangPlan) and spread.nodes == ("n1", "n3")
    # n2 frees: L1 holds both members now.
    c.unassign("default/filler-n2")
    got = plan_in_levels(c, members, BASE, REQUIRED_LEAF)
    assert isinstance(got, GangPlan) and got.nodes == ("n1", "n2") and got.domain == f"{LEAF}=L1"


def test_preferred_leaf_keeps_one_leaf_where_fewest_nodes_would_straddle() -> None:
    # L1: four nodes with 4 GPUs free each; L2: n5 and L3: n6 with 8 free. Four 4-GPU members:
    # fewest nodes is n5 + n6 (two leafs); a preferred leaf takes L1's four nodes (one leaf).
    c = cluster({"n1": "L1", "n2": "L1", "n3": "L1", "n4": "L1", "n5": "L2", "n6": "L3"})
    for n in ("n1", "n2", "n3", "n4"):
        take(c, n, 4)
    members = gang(4, gpu=4)
    free = plan_gang(c, members, BASE)
    assert isinstance(free, GangPlan) and free.nodes == ("n5", "n6")
    got = plan_in_levels(c, members, BASE, PREFERRED_LEAF)
    assert isinstance(got, GangPlan) and got.nodes == ("n1", "n2", "n3", "n4")
    assert got.domain == f"{LEAF}=L1"


def test_the_tightest_domain_that_holds_the_gang_is_taken() -> None:
    # L1 is empty (16 free), L2 has 12 free: a 2 x 6 gang goes to L2 and leaves L1 whole.
    c = cluster({"n1": "L1", "n2": "L1", "n3": "L2", "n4": "L2"})
    take(c, "n3", 2)
    take(c, "n4", 2)
    got = plan_in_levels(c, gang(2, gpu=6), BASE, REQUIRED_LEAF)
    assert isinstance(got, GangPlan) and got.nodes == ("n3", "n4")


def test_a_required_level_keeps_late_members_in_their_siblings_domain() -> None:
    # A sibling is bound on n3 (L2): the next member goes to L2 even though L1 is emptier.
    c = cluster({"n1": "L1", "n2": "L1", "n3": "L2", "n4": "L2"})
    take(c, "n3", 8, key="bound")
    got = plan_in_levels(c, gang(1), BASE, REQUIRED_LEAF, siblings={"n3": 1})
    assert isinstance(got, GangPlan) and got.nodes == ("n4",)
    take(c, "n4", 8)
    waiting = plan_in_levels(c, gang(1), BASE, REQUIRED_LEAF, siblings={"n3": 1})
    assert isinstance(waiting, NoPlan) and waiting.message.startswith(f"required leaf ({LEAF}): ")


def test_nodes_without_the_required_label_are_never_used() -> None:
    c = cluster({"n1": "", "n2": "L1"})
    take(c, "n2", 8)
    got = plan_in_levels(c, gang(1), BASE, REQUIRED_LEAF)
    assert isinstance(got, NoPlan) and f"required leaf ({LEAF})" in got.message
    assert isinstance(plan_in_levels(c, gang(1), BASE, PREFERRED_LEAF), GangPlan)
    bare = cluster({"n1": ""})
    none = plan_in_levels(bare, gang(1), BASE, REQUIRED_LEAF)
    assert isinstance(none, NoPlan) and none.message.endswith(f"none of 1 node carries the label {LEAF}")


def test_preemption_finds_victims_inside_one_domain_of_a_required_level() -> None:
    # L1: n1 free, n2 held by a low-priority pod; L2: n3 held by a low-priority pod, n4 free.
    # Evicting either filler makes room for 2 x 8, but only the L1 one (or L2 one) keeps one
    # leaf; cluster-wide no eviction is needed (n1 + n4), which a required leaf refuses.
    c = cluster({"n1": "L1", "n2": "L1", "n3": "L2", "n4": "L2"})
    low1 = take(c, "n2", 8, key="low1")
    low2 = take(c, "n3", 8, key="low2", priority=5)
    cands = [Candidate(low1, "n2", 0), Candidate(low2, "n3", 5)]
    got = preempt_in_levels(c, gang(2), cands, BASE, REQUIRED_LEAF)
    assert isinstance(got, PreemptionPlan)
    # Both leafs need one victim; the cheaper one (priority 0) is on L1.
    assert [v.key for v in got.victims] == [low1]
    assert got.plan.nodes == ("n1", "n2") and got.plan.domain == f"{LEAF}=L1"
    # Victims of an equal or higher priority are never taken: nothing to do then.
    none = preempt_in_levels(c, gang(2, priority=0), cands, BASE, REQUIRED_LEAF)
    assert isinstance(none, NoPlan) and none.message.startswith(f"required leaf ({LEAF}): ")


def test_keep_to_level_bounds_a_job_group_placed_one_by_one() -> None:
    c = cluster({"n1": "L1", "n2": "L1", "n3": "L2", "n4": ""})
    names = ["n1", "n2", "n3", "n4"]
    passed, refused = keep_to_level(c.nodes, names, {}, LEAF, "rl-job-group ns/ppo")
    assert (
        passed == ["n1", "n2", "n3"]
        and refused["n4"].message == f"rl-job-group ns/ppo needs the node label {LEAF}"
    )
    passed, refused = keep_to_level(c.nodes, names, {"n3": 2, "n1": 1}, LEAF, "rl-job-group ns/ppo")
    assert passed == ["n3"] and refused["n1"].message == f"rl-job-group ns/ppo keeps to {LEAF}=L2"
    assert not refused["n1"].unresolvable  # the siblings may leave


def leafs_of(c: ClusterState, plan: GangPlan) -> int:
    return len({c.nodes[n].labels[LEAF] for n in plan.nodes})


def test_on_random_clusters_a_level_never_spreads_a_gang_wider_than_no_level() -> None:
    """Seeded random load on three leafs of four nodes; random gangs. Whenever the planner
    without levels places a gang, a preferred leaf places it too in no more leafs, and a required
    leaf places it in one leaf or says why; a gang the planner without levels keeps in one leaf
    is never refused a required leaf."""
    rng = random.Random(7)
    narrower = 0
    for trial in range(60):
        c = cluster({f"n{i}": f"L{i // 4}" for i in range(12)})
        for i in range(12):
            if (held := rng.choice((0, 2, 4, 4, 6, 8))) > 0:
                take(c, f"n{i}", held)
        members = gang(rng.randint(2, 8), gpu=rng.choice((2, 4, 4, 8)))
        free = plan_gang(c, members, BASE)
        preferred = plan_in_levels(c, members, BASE, PREFERRED_LEAF)
        required = plan_in_levels(c, members, BASE, REQUIRED_LEAF)
        if not isinstance(free, GangPlan):
            assert isinstance(preferred, NoPlan) and isinstance(required, NoPlan), trial
            continue
        assert isinstance(preferred, GangPlan) and leafs_of(c, preferred) <= leafs_of(c, free), trial
        narrower += leafs_of(c, preferred) < leafs_of(c, free)
        if isinstance(required, GangPlan):
            assert leafs_of(c, required) == 1, trial
        else:
            assert leafs_of(c, free) > 1 and required.message.startswith(f"required leaf ({LEAF})"), trial
    assert narrower >= 3  # the seed has gangs that fewest nodes would straddle but one leaf holds
