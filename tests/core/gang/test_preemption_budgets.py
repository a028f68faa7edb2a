"""PodDisruptionBudgets in victim choice (allocator/core/gang/victims.py, preemption.py): protected
pods are the last resort, violations counted as kube-scheduler counts them, and a gang that holds
room re-plans without its own holds in its way."""

from __future__ import annotations

from allocator.core.cluster.state import ClusterState
from allocator.core.gang.plan import GangPlanSettings
from allocator.core.gang.preemption import PreemptionPlan, node_victims, plan_with_preemption
from allocator.core.gang.victims import Budget, Candidate, violations
from apis.annotations import DeviceAllocations
from tests.core.gang.test_preemption import CLIQUE, WHOLE, clique_cluster, fillers, hold, l40s, request
from tests.support.allocations import entry

KEEP_ALL = (("batch/pdb", 0),)  # maxUnavailable 0: the budget allows no disruption


def test_violations_are_counted_per_budget_in_key_order() -> None:
    one = (("ns/web", 1),)
    pods = [Candidate(f"ns/p{i}", "n", 0, budgets=one) for i in range(3)]
    assert violations(pods[:1]) == 0  # the budget allows one
    assert violations(pods) == 2  # the second and third find it used up
    both = Candidate("ns/q", "n", 0, budgets=(("ns/web", 5), ("ns/db", 0)))
    assert violations([both]) == 1  # one budget refusing is enough
    assert violations([Candidate("ns/free", "n", 0)]) == 0


def test_on_one_node_unprotected_pods_go_before_a_cheaper_protected_one() -> None:
    # L40S, 4 GPUs: one protected low pod holds GPUs 0-1 (one pod), two unprotected ones GPUs 2
    # and 3 (two pods). By pod count the protected pod is the cheaper victim.
    state = l40s()
    hold(state, "batch/big", 0, 1)
    hold(state, "a/x", 2)
    hold(state, "a/y", 3)
    for minor in range(4, 8):
        hold(state, f"vip/g{minor}", minor)
    vips = [Candidate(f"vip/g{m}", "n", 100) for m in range(4, 8)]
    low = [Candidate("a/x", "n", 0), Candidate("a/y", "n", 0)]
    req = request(gpus_spec(2), 50)
    plain = node_victims(state, req, [Candidate("batch/big", "n", 0), *low, *vips])
    assert plain is not None and [v.key for v in plain.victims] == ["batch/big"]
    guarded = node_victims(state, req, [Candidate("batch/big", "n", 0, budgets=KEEP_ALL), *low, *vips])
    assert guarded is not None and guarded.exact
    assert sorted(v.key for v in guarded.victims) == ["a/x", "a/y"]
    # Only protected pods can make room: they are taken (the last resort) rather than nothing.
    cornered = node_victims(state, req, [Candidate("batch/big", "n", 0, budgets=KEEP_ALL), *vips])
    assert cornered is not None and [v.key for v in cornered.victims] == ["batch/big"]


def gpus_spec(n: int) -> dict[str, str]:
    return {"nvidia.com/gpu": str(n)}


def _issue_cluster() -> ClusterState:
    """Clique a: two DGX H100 nodes, each with 8 low-priority 1-GPU pods; clique b: two, each with
    one 8-GPU low-priority pod. For a gang of two 8-GPU members b's two pods are the cheapest
    victims by count (2 against 16)."""
    c = clique_cluster({"a": 2})
    for i in range(2):
        name = f"b-{i}"
        c.upsert_node({"metadata": {"name": name, "labels": {CLIQUE: "b"}}, "status": {}})
        from tests.support.machines import dgx_h100_device

        c.set_device(dgx_h100_device(name))
        c.assign(f"batch/big-{i}", name, DeviceAllocations({"gpu": [entry(m, WHOLE) for m in range(8)]}))
    return c


def test_a_gang_goes_around_pods_a_budget_protects() -> None:
    """The issue's scenario: the cheapest victims are protected (maxUnavailable 0), another node set
    has unprotected lower-priority pods: the plan takes those."""
    c = _issue_cluster()
    members = [request(gpus_spec(8), 1000, name=f"w{i}") for i in range(2)]
    settings = GangPlanSettings(topology_keys=(CLIQUE,))
    unguarded = fillers(c)
    plain = plan_with_preemption(c, members, unguarded, settings)
    assert isinstance(plain, PreemptionPlan) and {v.key for v in plain.victims} == {
        "batch/big-0",
        "batch/big-1",
    }
    guarded = [
        Candidate(v.key, v.node, 0, budgets=KEEP_ALL if v.key.startswith("batch/") else ()) for v in unguarded
    ]
    got = plan_with_preemption(c, members, guarded, settings)
    assert isinstance(got, PreemptionPlan) and got.exact
    assert len(got.victims) == 16 and set(got.victim_nodes) == {"a-0", "a-1"}
    assert violations(got.victims) == 0
    # Over the search budget the fallback still goes around them.
    fallback = plan_with_preemption(c, members, guarded, settings, budget=Budget(0, 0))
    assert isinstance(fallback, PreemptionPlan) and not fallback.exact
    assert set(fallback.victim_nodes) == {"a-0", "a-1"} and violations(fallback.victims) == 0


def test_when_only_protected_pods_make_room_as_few_of_them_as_needed_go() -> None:
    c = _issue_cluster()
    members = [request(gpus_spec(8), 1000, name="w0")]
    everyone = [Candidate(v.key, v.node, 0, budgets=KEEP_ALL) for v in fillers(c)]
    got = plan_with_preemption(c, members, everyone, GangPlanSettings(topology_keys=(CLIQUE,)))
    assert isinstance(got, PreemptionPlan)
    assert [v.key for v in got.victims] in (["batch/big-0"], ["batch/big-1"])  # one violation, not 8


def test_a_gang_re_planning_its_hold_finds_its_own_held_room_free() -> None:
    # The member holds b-0's 8 GPUs (its plan's hold is assigned to its own key); re-planning around
    # the refused batch/big-1 it may keep b-0 and needs no victim at all.
    c = _issue_cluster()
    c.unassign("batch/big-0")
    c.assign("default/w0", "b-0", DeviceAllocations({"gpu": [entry(m, WHOLE) for m in range(8)]}))
    member = request(gpus_spec(8), 1000, name="w0")
    others = [v for v in fillers(c) if v.key not in ("default/w0", "batch/big-1")]
    got = plan_with_preemption(c, [member], others, GangPlanSettings(topology_keys=(CLIQUE,)))
    assert isinstance(got, PreemptionPlan) and got.victims == ()
    assert got.plan.nodes == ("b-0",)
