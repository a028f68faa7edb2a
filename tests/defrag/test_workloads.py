"""A workload's own limit on its pods moving at once: a Deployment's or StatefulSet's rolling
maxUnavailable (percentages of the replicas rounded down, as Kubernetes does) and the disruptions a
PodDisruptionBudget allows; the lowest wins."""

from __future__ import annotations

from allocator.core.defrag.inputs import PodFacts
from allocator.core.request.pod_request import PodRequest
from allocator.defrag.workloads import budget_allowed, caps, own_limit, scaled


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
    pods = {
        "a/p1": {"metadata": {"labels": {"app": "web"}}},
        "a/p2": {"metadata": {"labels": {"app": "web"}}},
        "b/p3": {"metadata": {"labels": {"app": "web"}}},
    }
    pdb = {
        "metadata": {"namespace": "a"},
        "spec": {"selector": {"matchLabels": {"app": "web"}}},
        "status": {"disruptionsAllowed": 1},
    }
    allowed = budget_allowed([pdb], pods)
    assert allowed == {"a/p1": 1, "a/p2": 1}  # another namespace's pods are not its own
    req = PodRequest()
    facts = [
        PodFacts("a/p1", "n0", 0, req, 1, "ReplicaSet", "a/ReplicaSet/web"),
        PodFacts("b/p3", "n0", 0, req, 1, "ReplicaSet", "b/ReplicaSet/web"),
    ]
    owners = {"a/ReplicaSet/web": deployment(8, 3), "b/ReplicaSet/web": deployment(8, 3)}
    got = caps(facts, owners, allowed)
    assert got == {
        "a/ReplicaSet/web": (1, "PodDisruptionBudget disruptionsAllowed"),
        "b/ReplicaSet/web": (3, "Deployment maxUnavailable"),
    }
