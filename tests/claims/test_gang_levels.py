"""A gang of claims on topology levels, through the running allocator (claims controller and gang
controller) on the fake API server: with a required rack, the two 8-GPU members' claims land in the
one rack with room, not across racks; with no rack that has room, the gang waits and says so; the
gang's Event names every node the members went to."""

from __future__ import annotations

from apis import keys
from apis.topology_profile import RACK
from tests.claims.harness import (
    allocation,
    bind_like_kube_scheduler,
    claims_world,
    dra_node,
    events,
    gates,
    make_claims,
    node_of_claim,
    serve_dra,
)
from tests.claims.objects import claim_pod, gpus, template
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Pki
from tests.support.polling import until

RACKS = {"a1": "r1", "a2": "r1", "b1": "r2", "b2": "r2"}


def rack_nodes(fake: FakeApiServer) -> None:
    for name, rack in RACKS.items():
        dra_node(fake, name)
        node = fake.get("nodes", name)
        node["metadata"]["labels"][RACK] = rack
        fake.put(node)


def podgroup(name: str, size: int, wish: str = "") -> dict:
    meta: dict = {"name": name, "namespace": "default"}
    if wish:
        meta["annotations"] = {keys.REQUIRED_TOPOLOGY: wish}
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": meta,
        "spec": {"minMember": size},
    }


async def test_a_gang_of_claims_with_a_required_rack_lands_in_one_rack_or_waits(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    serve_dra(fake_api)
    rack_nodes(fake_api)
    fake_api.put(template("eight", gpus(8)))
    for group in ("g", "late"):
        fake_api.put(podgroup(group, 2, "rack"))
    async with claims_world(fake_api, pki) as w:
        await until(lambda: len(w.run.service.cache.dra.published) == 4)
        # a2 is taken (its GPUs by another claim): rack r1 cannot hold two 8-GPU members
        filler = claim_pod("filler", templates={"gpus": "eight"})
        filler["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "a2"}
        await w.create_pod(filler)
        make_claims(fake_api, "filler")
        await until(lambda: allocation(fake_api, "filler-gpus") is not None, what="the filler's claim")
        bind_like_kube_scheduler(fake_api, "filler", ["filler-gpus"])
        for name in ("g-0", "g-1"):
            pod = claim_pod(name, templates={"gpus": "eight"})
            pod["metadata"]["labels"] = {"scheduling.x-k8s.io/pod-group": "g"}
            await w.create_pod(pod)
            make_claims(fake_api, name)
        await until(lambda: not gates(fake_api, "g-0") and not gates(fake_api, "g-1"), what="g ungated")
        assert sorted(node_of_claim(fake_api, f"g-{i}-gpus") for i in range(2)) == ["b1", "b2"]
        # the gang's own Event names both nodes, not one
        await until(lambda: events(fake_api, "GangPlanned"), what="the gang's Event")
        planned = events(fake_api, "GangPlanned")
        assert any("2 member(s) on b1, b2" in e for e in planned), planned
        for i in range(2):
            bind_like_kube_scheduler(fake_api, f"g-{i}", [f"g-{i}-gpus"])
        # a1 alone is free now: the next gang waits, naming its level
        for name in ("late-0", "late-1"):
            pod = claim_pod(name, templates={"gpus": "eight"})
            pod["metadata"]["labels"] = {"scheduling.x-k8s.io/pod-group": "late"}
            await w.create_pod(pod)
            make_claims(fake_api, name)
        await until(
            lambda: [e for e in events(fake_api, "DRAAllocationFailed") if "gang default/late" in e],
            what="the late gang's Events",
        )
        failed = [e for e in events(fake_api, "DRAAllocationFailed") if "gang default/late" in e]
        assert all("required rack (topoalloc.io/rack)" in e for e in failed), failed
        for name in ("late-0", "late-1"):
            assert allocation(fake_api, f"{name}-gpus") is None and gates(fake_api, name)
