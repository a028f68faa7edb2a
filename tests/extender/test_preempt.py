"""The extender's preempt verb against the real allocator over mutual TLS: for each node
kube-scheduler proposes, victims that really make room for the pod's GPUs, never an equal or
higher priority, a running gang only whole; nodes where no such set exists are dropped."""

from __future__ import annotations

from typing import Any

from tests.gang.harness import bound_elsewhere, gpu_node, member
from tests.support.allocator_harness import running_allocator
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Pki

JSON = dict[str, Any]


def preemptor(gpus: int, priority: int, **extra: Any) -> JSON:
    pod = member("big", gpus=gpus, priority=priority, **extra)
    pod["metadata"]["uid"] = "u-big"
    return pod


def args(pod: JSON, proposed: dict[str, list[str]]) -> JSON:
    victims = {n: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": 0} for n, uids in proposed.items()}
    return {"Pod": pod, "NodeNameToVictims": None, "NodeNameToMetaVictims": victims}


async def test_preempt_keeps_nodes_whose_victims_free_the_gpus_and_drops_the_rest(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    for name in ("n1", "n2", "n3"):
        gpu_node(fake_api, name)
    # n1: eight 1-GPU pods of priority 0. n2: four of priority 0, four of priority 100 (equal to the
    # preemptor's). n3: one running 2-member gang (4 GPUs each), priority 0.
    low1 = [bound_elsewhere(fake_api, f"a{m}", "n1", [m], priority=0) for m in range(8)]
    low2 = [bound_elsewhere(fake_api, f"b{m}", "n2", [m], priority=0) for m in range(4)]
    peers = [bound_elsewhere(fake_api, f"c{m}", "n2", [m], priority=100) for m in range(4, 8)]
    gang = [
        bound_elsewhere(fake_api, f"job{i}", "n3", [4 * i + m for m in range(4)], priority=0, group="job")
        for i in range(2)
    ]
    async with running_allocator(fake_api, pki) as r:
        # kube-scheduler counted: it would take all of n2 (it may not: equal priority) and one
        # gang member on n3.
        proposed = {"n1": low1, "n2": low2 + peers, "n3": gang[:1]}
        status, body = await r.client.post("preempt", args(preemptor(8, 100), proposed))
        assert status == 200, body
        got = {n: sorted(p["UID"] for p in v["Pods"]) for n, v in body["NodeNameToMetaVictims"].items()}
        assert got == {"n1": sorted(low1), "n3": sorted(gang)}
        # One GPU: the cheapest single pod on n2; on n3 only the whole gang can go.
        status, body = await r.client.post("preempt", args(preemptor(1, 100), {"n2": low2, "n3": gang}))
        got = {n: sorted(p["UID"] for p in v["Pods"]) for n, v in body["NodeNameToMetaVictims"].items()}
        assert got == {"n2": [low2[0]], "n3": sorted(gang)}  # equal costs: by name, default/b0


async def test_gang_members_never_preempt_here_and_pods_without_devices_keep_the_proposal(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    gpu_node(fake_api, "n1")
    uids = [bound_elsewhere(fake_api, f"a{m}", "n1", [m], priority=0) for m in range(8)]
    async with running_allocator(fake_api, pki) as r:
        status, body = await r.client.post("preempt", args(preemptor(8, 100, group="g"), {"n1": uids}))
        assert status == 200 and body == {"NodeNameToMetaVictims": {}}
        plain = preemptor(0, 100)
        status, body = await r.client.post("preempt", args(plain, {"n1": uids[:2]}))
        assert [p["UID"] for p in body["NodeNameToMetaVictims"]["n1"]["Pods"]] == uids[:2]
        status, body = await r.client.post("preempt", {"NodeNameToMetaVictims": {}})
        assert status == 400 and "Pod" in body
