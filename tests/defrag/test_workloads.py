"""A workload's own limit on its pods moving at once: a Deployment's or StatefulSet's rolling
maxUnavailable (percentages of the replicas rounded down, as Kubernetes does) and the disruptions a
PodDisruptionBudget allows; the lowest wins. A maxUnavailable counts the workload's pods down
too."""

from __future__ import annotations

import dataclasses

from allocator.core.defrag.inputs import DefragPlanSettings, PodFacts
from allocator.core.defrag.migration import CreateReservation, Limits, WorkloadCap, step
from allocator.core.defrag.plan import plan_defrag
from allocator.core.request.pod_request import PodRequest
from allocator.defrag.workloads import caps, own_limit, scaled, unavailable
from allocator.runtime.cache.budgets import DisruptionBudgets
from tests.core.defrag.world import World, gang


def deployment(replicas: int, max_unavailable: object = None, kind: str = "RollingUpdate") -> dict:
    rolling = {} if max_unavailable is None else {"rollingUpdate": {"maxUnavailable": max_unavailable}}
    return {"kind": "Deployment", "spec": {"replicas": replicas, "strategy": {"type": kind, **rolling}}}


def test_percentages_round_down_and_counts_are_kept() -> None:
    assert scaled("25%", 8, "25%") == 2 and scaled("25%", 3, "25%") == 0 and scaled(3, 8, "25%") == 3
    assert scaled(None, 10, "25%") == 2 and scaled("junk", 8, "25%") == 2


def test_deployment_statefulset_and_others() -> None:
    assert own_limit(deployment(8)) == (2, "Deployment maxUnavailable")
    assert own_limit(deployment(8, 1)) == (1, "Deployment maxUnavailable")
    assert own_limit(deployment(8, "50%")) == (4, "Deployment maxUnavailable")
    assert own_limit(deployment(8, kind="Recreate")) is None
    assert own_limit({"kind": "StatefulSet", "spec": {"replicas": 5}}) == (1, "StatefulSet maxUnavailable")
    assert own_limit({"kind": "Job", "spec": {}}) is None


def test_the_lowest_of_owner_and_budgets_wins() -> None:
    budgets = DisruptionBudgets()
    budgets.upsert(
        {
            "metadata": {"namespace": "a", "name": "web"},
            "spec": {"selector": {"matchLabels": {"app": "web"}}},
            "status": {"disruptionsAllowed": 1},
        }
    )
    web = {"app": "web"}
    # another namespace's pods are not its own
    assert budgets.selecting("a", web) == (("a/web", 1),) and budgets.selecting("b", web) == ()
    allowed = {"a/p1": 1}
    req = PodRequest()
    facts = [
        PodFacts("a/p1", "n0", 0, req, 1, "ReplicaSet", "a/ReplicaSet/web"),
        PodFacts("b/p3", "n0", 0, req, 1, "ReplicaSet", "b/ReplicaSet/web"),
    ]
    owners = {"a/ReplicaSet/web": deployment(8, 3), "b/ReplicaSet/web": deployment(8, 3)}
    got = caps(facts, owners, allowed)
    assert got == {
        "a/ReplicaSet/web": (
            WorkloadCap(3, "Deployment maxUnavailable"),
            WorkloadCap(1, "PodDisruptionBudget disruptionsAllowed"),
        ),
        "b/ReplicaSet/web": (WorkloadCap(3, "Deployment maxUnavailable"),),
    }
    # the lowest wins: one move of a's, three of b's
    limits = Limits(max_migrating=9, per_namespace=9, per_workload=9)
    assert moves_allowed(limits, "a/ReplicaSet/web", got) == 1
    assert moves_allowed(limits, "b/ReplicaSet/web", got) == 3


def test_a_max_unavailable_counts_the_replicas_not_ready_less_the_moves_evicted() -> None:
    owner = deployment(8, "25%")
    assert unavailable(owner, ready=8, evicted=0) == 0
    assert unavailable(owner, ready=6, evicted=0) == 2  # two not Ready, or missing
    assert unavailable(owner, ready=6, evicted=1) == 1  # one of them is a move's (it counts itself)
    assert unavailable(owner, ready=8, evicted=1) == 0
    got = caps(
        [PodFacts("a/p1", "n0", 0, PodRequest(), 1, "ReplicaSet", "a/ReplicaSet/web")],
        {"a/ReplicaSet/web": owner},
        {},
        {"a/ReplicaSet/web": 1},
    )
    assert got == {"a/ReplicaSet/web": (WorkloadCap(2, "Deployment maxUnavailable", unavailable=1),)}
    limits = Limits(max_migrating=9, per_namespace=9, per_workload=9)
    assert moves_allowed(limits, "a/ReplicaSet/web", got) == 1


def moves_allowed(limits: Limits, workload: str, got: dict[str, tuple[WorkloadCap, ...]]) -> int:
    """How many moves of the workload's pods `step` starts at once, of many planned."""
    world = World(4)
    for i in range(4):
        for g in range(2):
            world.run(f"{workload.split('/')[0]}/p{i}-{g}", f"n{i}", [g])
    facts = [dataclasses.replace(f, workload=workload, owner_kind="ReplicaSet") for f in world.facts]
    plan = plan_defrag(world.cluster, [gang("big", 1, 8), gang("big2", 1, 8)], facts, DefragPlanSettings())
    assert len(plan.moves) == 4
    actions = step([], plan, limits, 0.0, dry_run=False, caps=got)
    return sum(1 for a in actions if isinstance(a, CreateReservation))
