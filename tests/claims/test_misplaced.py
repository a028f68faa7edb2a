"""A pod kube-scheduler bound to the node its claim was on before topoalloc moved the claim (a
scheduling attempt begun before the move binds without writing the claim): the claims controller
with the real allocator against the fake API server evicts it through its controller, budgets
honoured, or says it is stuck."""

from __future__ import annotations

from typing import Any

from tests.claims.harness import (
    CLAIMS,
    allocation,
    claims_world,
    dra_node,
    events,
    gates,
    make_claims,
    node_of_claim,
    refuse_like_kube_scheduler,
    serve_dra,
)
from tests.claims.objects import claim_pod, gpus, template
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Pki
from tests.support.polling import until

REASON = "DRAClaimOnAnotherNode"
OWNER = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "rs-uid", "controller": True}


def counted(w: Any, outcome: str) -> float:
    return w.run.metric("topoalloc_dra_double_booked_total", {"outcome": outcome}) or 0.0


async def moved_then_bound_to_the_old_node(fake: FakeApiServer, w: Any, owned: bool) -> tuple[str, str]:
    """p's claim allocated on one node, moved after kube-scheduler refused it there, and p bound to
    the first node all the same (the claim, reserved for p, not written): (old node, new node)."""
    pod = claim_pod("p", templates={"g": "one"})
    pod["metadata"]["labels"] = {"app": "p"}
    if owned:
        pod["metadata"]["ownerReferences"] = [OWNER]
    await w.create_pod(pod)
    make_claims(fake, "p")
    await until(lambda: not gates(fake, "p"), what="p ungated")
    old = node_of_claim(fake, "p-g")
    refuse_like_kube_scheduler(fake, "p", f"0/2 nodes are available: 1 Insufficient cpu on {old}")
    await until(lambda: allocation(fake, "p-g") and node_of_claim(fake, "p-g") != old, what="moved")
    new = node_of_claim(fake, "p-g")
    stored = fake.get(CLAIMS, "p-g", "default")
    assert stored is not None and [r["name"] for r in stored["status"]["reservedFor"]] == ["p"]
    bound = fake.get("pods", "p", "default")
    assert bound is not None
    bound["spec"]["nodeName"] = old
    fake.put(bound)
    return old, new


def deleting(fake: FakeApiServer, name: str) -> bool:
    obj = fake.get("pods", name, "default")
    return obj is None or bool(obj["metadata"].get("deletionTimestamp"))


async def test_a_pod_bound_to_the_old_node_of_its_moved_claim_is_evicted(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    serve_dra(fake_api)
    dra_node(fake_api, "n1")
    dra_node(fake_api, "n2")
    fake_api.put(template("one", gpus(1)))
    # A budget allowing no disruption: the eviction waits for it.
    fake_api.put(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "pdb", "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": "p"}}, "maxUnavailable": 0},
            "status": {"disruptionsAllowed": 0},
        }
    )
    async with claims_world(fake_api, pki) as w:
        await until(lambda: len(w.run.service.cache.dra.published) == 2)
        old, new = await moved_then_bound_to_the_old_node(fake_api, w, owned=True)
        await until(lambda: events(fake_api, REASON), what="the Event")
        (note,) = events(fake_api, REASON)
        assert f"claim default/p-g is allocated on node {new} but the pod was bound to node {old}" in note
        assert "evicted for its controller (ReplicaSet/rs)" in note
        await until(lambda: counted(w, "evicted") == 1, what="counted")
        await w.runner.wait_passes(2)
        assert not deleting(fake_api, "p")  # the budget allows no disruption yet
        budget = fake_api.get("poddisruptionbudgets", "pdb", "default")
        assert budget is not None
        budget["status"]["disruptionsAllowed"] = 1
        fake_api.put(budget)
        await until(lambda: deleting(fake_api, "p"), what="p evicted once its budget allows it")
        assert len(events(fake_api, REASON)) == 1  # the retries say nothing new


async def test_a_bare_pod_bound_to_the_old_node_says_it_is_stuck(fake_api: FakeApiServer, pki: Pki) -> None:
    serve_dra(fake_api)
    dra_node(fake_api, "n1")
    dra_node(fake_api, "n2")
    fake_api.put(template("one", gpus(1)))
    async with claims_world(fake_api, pki) as w:
        await until(lambda: len(w.run.service.cache.dra.published) == 2)
        old, new = await moved_then_bound_to_the_old_node(fake_api, w, owned=False)
        await until(lambda: events(fake_api, REASON), what="the Event")
        (note,) = events(fake_api, REASON)
        assert f"allocated on node {new} but the pod was bound to node {old}" in note
        assert "no controller to make it again and cannot be moved" in note
        assert counted(w, "stuck") == 1 and counted(w, "evicted") == 0
        await w.runner.wait_passes(2)
        assert not deleting(fake_api, "p") and len(events(fake_api, REASON)) == 1


async def test_a_pod_bound_to_its_claims_node_is_left_alone(fake_api: FakeApiServer, pki: Pki) -> None:
    serve_dra(fake_api)
    dra_node(fake_api, "n1")
    dra_node(fake_api, "n2")
    fake_api.put(template("one", gpus(1)))
    async with claims_world(fake_api, pki) as w:
        await until(lambda: len(w.run.service.cache.dra.published) == 2)
        pod = claim_pod("p", templates={"g": "one"})
        pod["metadata"]["ownerReferences"] = [OWNER]
        await w.create_pod(pod)
        make_claims(fake_api, "p")
        await until(lambda: not gates(fake_api, "p"), what="p ungated")
        bound = fake_api.get("pods", "p", "default")
        assert bound is not None
        bound["spec"]["nodeName"] = node_of_claim(fake_api, "p-g")
        fake_api.put(bound)
        await until(lambda: (e := w.run.service.cache.pods.get("default/p")) is not None and bool(e.node))
        await w.runner.wait_passes(2)
        assert not deleting(fake_api, "p") and events(fake_api, REASON) == []
