"""The defragmentation planner on hand-built DGX H100 clusters whose cheapest moves are worked out
by hand (allocator/core/defrag)."""

from __future__ import annotations

from allocator.core.defrag.blocks import fragmentation
from allocator.core.defrag.inputs import DefragPlanSettings, why_immovable
from allocator.core.defrag.plan import PROACTIVE, plan_defrag
from allocator.core.gang.plan import GangPlan
from tests.core.defrag.world import HOUR, World, gang


def spread(world: World, per_node: int, nodes: int, **kw: object) -> None:
    """`per_node` 1-GPU pods on each node's first GPUs."""
    for i in range(nodes):
        for g in range(per_node):
            world.run(f"web-{i}-{g}", f"n{i}", [g], **kw)  # type: ignore[arg-type]


def test_the_issue_case_moves_the_fewest_pods_and_the_gang_then_fits() -> None:
    # Four nodes each run two 1-GPU pods: 24 GPUs free, no node with 8. One 8-GPU pod waits.
    w = World(4)
    spread(w, 2, 4)
    assert fragmentation(w.cluster.nodes).largest_block == 6
    plan = plan_defrag(w.cluster, [gang("big", 1, 8)], w.facts)
    assert len(plan.moves) == 2 and {m.source for m in plan.moves} == {plan.moves[0].source}
    (unblocked,) = plan.unblocked
    assert unblocked.exact and unblocked.plan is not None
    assert unblocked.plan.nodes == (plan.moves[0].source,)
    for m in plan.moves:
        assert m.target != m.source and len(m.allocation.minors("gpu")) == 1
    assert plan.largest_before == 6 and plan.largest_after == 8
    assert all(m.unblocks == "gang train/big" for m in plan.moves)


def test_cluster_is_not_changed() -> None:
    w = World(2)
    spread(w, 2, 2)
    before = {n: dict(s.pods) for n, s in w.cluster.nodes.items()}
    plan_defrag(w.cluster, [gang("big", 1, 8)], w.facts)
    assert {n: dict(s.pods) for n, s in w.cluster.nodes.items()} == before


def test_a_node_with_one_pod_is_cleared_before_nodes_with_two() -> None:
    w = World(3)
    w.run("a-0", "n0", [0])
    w.run("a-1", "n0", [1])
    w.run("b-0", "n1", [0])
    w.run("c-0", "n2", [0])
    w.run("c-1", "n2", [1])
    plan = plan_defrag(w.cluster, [gang("big", 1, 8)], w.facts)
    assert [(m.key, m.source) for m in plan.moves] == [("default/b-0", "n1")]


def test_equal_counts_lose_the_fewest_gpu_hours() -> None:
    w = World(3)
    now = 10 * HOUR
    w.run("old-0", "n0", [0], started=0.0)
    w.run("new-0", "n1", [0], started=9 * HOUR)
    w.run("mid-0", "n2", [0], started=5 * HOUR)
    plan = plan_defrag(w.cluster, [gang("big", 1, 8)], w.facts, now=now)
    (move,) = plan.moves
    assert move.key == "default/new-0" and move.gpu_hours == 1.0


def test_a_waiter_that_fits_needs_no_move() -> None:
    w = World(2)
    spread(w, 2, 2)
    plan = plan_defrag(w.cluster, [gang("small", 2, 4)], w.facts)
    assert plan.moves == () and plan.fits == ("gang train/small",)


def test_immovable_pods_are_never_moved() -> None:
    # Node n0: a higher-priority pod; n1: a bare pod; n2: a gang member; n3: PDB-protected;
    # n4: a DaemonSet's pod. Only n5's pods (two of a ReplicaSet) may move.
    w = World(6)
    w.run("vip-0", "n0", [0], priority=500)
    w.run("bare-0", "n1", [0], owner="")
    w.run("member-0", "n2", [0], gang="ns/job")
    w.run("pdb-0", "n3", [0], protected=True)
    w.run("ds-0", "n4", [0], owner="DaemonSet")
    w.run("web-0", "n5", [0])
    w.run("web-1", "n5", [1])
    plan = plan_defrag(w.cluster, [gang("big", 1, 8)], w.facts)
    assert sorted(m.key for m in plan.moves) == ["default/web-0", "default/web-1"]
    reasons = {f.key: why_immovable(f, 100, DefragPlanSettings()) for f in w.facts}
    assert reasons["default/vip-0"].startswith("priority 500")
    assert reasons["default/bare-0"] == "a bare pod"
    assert reasons["default/member-0"] == "member of gang ns/job"
    assert reasons["default/pdb-0"].startswith("a PodDisruptionBudget")
    assert reasons["default/ds-0"] == "a DaemonSet's pod"
    assert reasons["default/web-0"] == ""


def test_bare_pods_move_only_when_allowed() -> None:
    w = World(2)
    w.run("bare-0", "n0", [0], owner="")
    w.run("bare-1", "n1", [0], owner="")
    plan = plan_defrag(w.cluster, [gang("big", 1, 8)], w.facts)
    assert plan.moves == () and plan.stuck[0][0] == "gang train/big"
    assert "no pod may move" in plan.stuck[0][1]
    allowed = plan_defrag(w.cluster, [gang("big", 1, 8)], w.facts, DefragPlanSettings(allow_bare=True))
    assert len(allowed.moves) == 1


def test_no_room_to_land_means_no_move() -> None:
    # Both nodes hold 7 GPUs' worth of movable pods: clearing one needs 7 free GPUs on the other.
    w = World(2)
    w.run("a-0", "n0", list(range(7)))
    w.run("b-0", "n1", [0])
    w.run("c-0", "n1", [1, 2, 3, 4, 5, 6])
    plan = plan_defrag(w.cluster, [gang("big", 1, 8)], w.facts)
    assert plan.moves == () and plan.stuck


def test_max_moves_caps_a_plan() -> None:
    w = World(3)
    spread(w, 3, 3)
    assert len(plan_defrag(w.cluster, [gang("big", 1, 8)], w.facts).moves) == 3
    capped = plan_defrag(w.cluster, [gang("big", 1, 8)], w.facts, DefragPlanSettings(max_moves=2))
    assert capped.moves == () and "2 moves or fewer" in capped.stuck[0][1]


def test_two_waiters_plan_around_each_other() -> None:
    w = World(4)
    spread(w, 1, 4)
    plan = plan_defrag(w.cluster, [gang("one", 1, 8), gang("two", 1, 8)], w.facts)
    assert [u.waiter for u in plan.unblocked] == ["gang train/one", "gang train/two"]
    first, second = (u.plan for u in plan.unblocked)
    assert isinstance(first, GangPlan) and isinstance(second, GangPlan)
    assert first.nodes != second.nodes
    assert len({m.key for m in plan.moves}) == len(plan.moves) == 2


def test_the_fallback_past_the_budget_is_inclusion_minimal() -> None:
    w = World(4)
    spread(w, 2, 4)
    plan = plan_defrag(w.cluster, [gang("big", 1, 8)], w.facts, DefragPlanSettings(subsets=1))
    (unblocked,) = plan.unblocked
    assert not unblocked.exact and len(plan.moves) == 2


def test_gangs_of_4_gpu_members_need_two_nodes_cleared_halfway() -> None:
    # Each node runs five 1-GPU pods (3 free). A gang of two 4-GPU members: one pod off each of
    # two nodes is the cheapest; the movers land on the other nodes' free GPUs.
    w = World(4)
    spread(w, 5, 4)
    plan = plan_defrag(w.cluster, [gang("pair", 2, 4)], w.facts)
    assert len(plan.moves) == 2
    assert len({m.source for m in plan.moves}) == 2


def test_proactive_mode_clears_the_cheapest_node_when_nothing_waits() -> None:
    w = World(3)
    w.run("a-0", "n0", [0])
    w.run("b-0", "n1", [0])
    w.run("b-1", "n1", [1])
    w.run("c-0", "n2", [0])
    w.run("c-1", "n2", [1])
    settings = DefragPlanSettings(proactive=True, proactive_priority=1)
    plan = plan_defrag(w.cluster, [], w.facts, settings)
    assert [(m.key, m.unblocks) for m in plan.moves] == [("default/a-0", PROACTIVE)]
    assert plan.largest_after == 8 > plan.largest_before
    assert plan_defrag(w.cluster, [], w.facts).moves == ()  # off by default


def test_proactive_mode_makes_no_move_that_does_not_raise_the_block() -> None:
    w = World(2)
    w.run("a-0", "n0", [0, 1, 2, 3, 4])
    w.run("b-0", "n1", [0, 1, 2, 3, 4])
    plan = plan_defrag(w.cluster, [], w.facts, DefragPlanSettings(proactive=True, proactive_priority=1))
    assert plan.moves == ()
