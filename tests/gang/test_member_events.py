"""A PodGroup gang's decisions reach its member pods as Events, once per kind of decision, and a
PodGroup whose minResources cannot be met waits with InsufficientResources without planning."""

from __future__ import annotations

from typing import Any

from tests.gang.harness import (
    GangWorld,
    bound_elsewhere,
    condition,
    gang_world,
    gpu_node,
    member,
    node_of,
    podgroup,
)
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Pki
from tests.support.polling import until


def reasons(w: GangWorld, pod: str) -> list[str]:
    return [e.get("reason") or "" for e in w.events_about(pod)]


def passes(w: GangWorld) -> int:
    gang: Any = w.service.component("gang")
    return int(gang.controller.runner.passes)


async def test_members_hear_each_decision_once(fake_api: FakeApiServer, pki: Pki) -> None:
    # One node, 4 GPUs taken: a gang of two 4-GPU members has room for one only.
    gpu_node(fake_api, "n1")
    bound_elsewhere(fake_api, "busy", "n1", [0, 1, 2, 3])
    async with gang_world(fake_api, pki) as w:
        await w.admission.create_podgroup(podgroup("pair", 2))
        await w.admission.create_pod(member("p0", group="pair", gpus=4))
        await until(lambda: "GangWaiting" in reasons(w, "p0"), 5)  # WaitingForMembers
        await w.admission.create_pod(member("p1", group="pair", gpus=4))
        await until(lambda: reasons(w, "p1") == ["GangWaiting"], 5)
        await until(lambda: len(reasons(w, "p0")) == 2, 5)  # WaitingForMembers, then this
        note = w.notes_about("p1")[0]
        assert note.startswith("gang default/pair waits (InsufficientResources): no placement for 2 more")
        # Many passes later the members have not been told again; the PodGroup has its Event.
        seen = passes(w)
        await until(lambda: passes(w) >= seen + 3, 10)
        await w.service.events.drain()
        assert reasons(w, "p1") == ["GangWaiting"]
        assert any("no placement for 2 more" in n for n in w.notes_about("pair", "PodGroup"))
        # Room appears: planned and scheduled, each told once.
        await w.admission.delete_pod("busy")
        await until(lambda: node_of(w.pods()["p0"]) == node_of(w.pods()["p1"]) == "n1", 10)
        await until(lambda: "GangScheduled" in reasons(w, "p1"), 5)
        told = sorted(r for r in reasons(w, "p1") if r.startswith("Gang"))  # listed in name order
        assert told == ["GangPlanned", "GangScheduled", "GangWaiting"]
        assert "gang default/pair: 2 of 2 members are bound" in w.notes_about("p1")


async def test_min_resources_beyond_the_cluster_waits_without_planning(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    gpu_node(fake_api, "n1")
    gpu_node(fake_api, "n2")
    async with gang_world(fake_api, pki) as w:
        group = podgroup("big", 2)
        group["spec"]["minResources"] = {"nvidia.com/gpu": "24", "cpu": "2"}
        await w.admission.create_podgroup(group)
        # The members themselves would fit (2 x 8 GPUs on two nodes): minResources says more.
        for i in range(2):
            await w.admission.create_pod(member(f"b{i}", group="big", gpus=8))
        await until(
            lambda: condition(w.podgroup_status("big"), "Waiting").get("reason") == "InsufficientResources", 5
        )
        waiting = condition(w.podgroup_status("big"), "Waiting")
        assert waiting["reason"] == "InsufficientResources"
        assert (
            waiting["message"]
            == "minResources nvidia.com/gpu=24 is more than the nodes the gang may use have (16)"
        )
        # b1 was created after the gang had its minimum: its only Event is this one.
        await until(lambda: reasons(w, "b1") == ["GangWaiting"], 5)
        assert "waits (InsufficientResources): minResources nvidia.com/gpu=24" in w.notes_about("b1")[0]
        assert w.gang_reservations() == {}
        assert all(not node_of(p) for p in w.pods().values())
        # A third node: the cluster can offer 24 GPUs, so the gang is planned.
        gpu_node(fake_api, "n3")
        await until(lambda: all(node_of(w.pods()[f"b{i}"]) for i in range(2)), 10)
        await until(lambda: condition(w.podgroup_status("big"), "Scheduled").get("status") == "True", 5)
