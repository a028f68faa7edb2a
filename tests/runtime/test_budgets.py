"""PodDisruptionBudgets as the watch cache keeps them for preemption (allocator/runtime/cache/
budgets.py): what each selects and allows, fed through the cache, and carried on the candidates."""

from __future__ import annotations

from typing import Any

from allocator.runtime.cache.budgets import DisruptionBudgets, budget_of
from allocator.runtime.cache.store import ClusterCache
from allocator.runtime.cache.victims import all_candidates
from allocator.runtime.coreadapter import CoreAdapter
from allocator.runtime.kube import PDBS, PODS


def pdb(name: str, selector: dict[str, Any] | None, allowed: int | None, *, ns: str = "a", gen: int = 1,
        observed: int = 1) -> dict[str, Any]:  # fmt: skip
    spec: dict[str, Any] = {"maxUnavailable": 1}
    if selector is not None:
        spec["selector"] = selector
    status: dict[str, Any] = {"observedGeneration": observed}
    if allowed is not None:
        status["disruptionsAllowed"] = allowed
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": ns, "generation": gen},
        "spec": spec,
        "status": status,
    }


def test_what_a_budget_selects_and_allows() -> None:
    budgets = DisruptionBudgets()
    budgets.upsert(pdb("web", {"matchLabels": {"app": "web"}}, 2))
    budgets.upsert(pdb("all", {}, 1))  # policy/v1: an empty selector selects the whole namespace
    budgets.upsert(pdb("none", None, 5))  # no selector: no pod
    budgets.upsert(pdb("db", {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["db"]}]}, 0))
    budgets.upsert(pdb("elsewhere", {}, 3, ns="b"))
    assert budgets.selecting("a", {"app": "web"}) == (("a/all", 1), ("a/web", 2))
    assert budgets.selecting("a", {"tier": "db"}) == (("a/all", 1), ("a/db", 0))
    assert budgets.selecting("c", {"app": "web"}) == ()
    budgets.delete("a/all")
    assert budgets.selecting("a", {"app": "web"}) == (("a/web", 2),)
    assert sorted(budgets) == ["a/db", "a/none", "a/web", "b/elsewhere"]


def test_a_budget_the_controller_has_not_caught_up_with_allows_nothing() -> None:
    # The Eviction API refuses while status.observedGeneration is behind: so does the planner.
    assert budget_of(pdb("web", {}, 3, gen=2, observed=1)).allowed == 0
    assert budget_of(pdb("web", {}, None)).allowed == 0  # no status yet
    assert budget_of(pdb("web", {}, 3, gen=2, observed=2)).allowed == 3
    bad = budget_of(pdb("web", {"matchExpressions": [{"key": "x", "operator": "Near"}]}, 3))
    assert bad.selector is None  # selects nothing rather than everything


def bound(name: str, labels: dict[str, str], node: str = "n1") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "a", "uid": f"uid-{name}", "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "c"}]},
        "status": {"phase": "Running"},
    }


def test_the_cache_carries_budgets_to_the_preemption_candidates() -> None:
    cache = ClusterCache(CoreAdapter())
    cache.replace(PODS, [bound("w0", {"app": "web"}), bound("x0", {"app": "other"})])
    cache.replace(PDBS, [pdb("web", {"matchLabels": {"app": "web"}}, 0)])
    by_key = {c.key: c for c in all_candidates(cache.pods, set(), cache.budgets)}
    assert by_key["a/w0"].budgets == (("a/web", 0),) and by_key["a/x0"].budgets == ()
    # a status update (the controller counted again) and a relabelled pod are seen
    cache.apply(PDBS, "MODIFIED", pdb("web", {"matchLabels": {"app": "web"}}, 1))
    cache.apply(PODS, "MODIFIED", bound("x0", {"app": "web"}))
    by_key = {c.key: c for c in all_candidates(cache.pods, set(), cache.budgets)}
    assert by_key["a/w0"].budgets == by_key["a/x0"].budgets == (("a/web", 1),)
    cache.apply(PDBS, "DELETED", pdb("web", {}, 1))
    assert all(c.budgets == () for c in all_candidates(cache.pods, set(), cache.budgets))
    cache.replace(PDBS, [pdb("all", {}, 2)])
    assert {c.budgets for c in all_candidates(cache.pods, set(), cache.budgets)} == {(("a/all", 2),)}
    cache.replace(PDBS, [])
    assert len(cache.budgets) == 0
