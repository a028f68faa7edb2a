"""No starvation: the first waiting gang, past `gang.starvationBound`, gets the room of the nodes
it needs fewest pods to leave held for it as they free up; other pods backfill only elsewhere."""

from __future__ import annotations

from tests.gang.harness import GangWorld, bound_elsewhere, gang_world, gpu_node, member, node_of, podgroup
from tests.gang.native import GANG_KINDS, GangKind
from tests.support.allocator_harness import double_booked
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Pki
from tests.support.polling import until

SCHEDULER_PLUGINS = GANG_KINDS[0]


def waiting(w: GangWorld, name: str, kind: GangKind = SCHEDULER_PLUGINS) -> dict[str, str]:
    conditions = kind.status(w, name).get("conditions") or []
    return next((c for c in conditions if c["type"] == "Waiting"), {})


async def test_a_starving_gang_holds_the_room_freeing_up_and_small_pods_go_elsewhere(
    fake_api: FakeApiServer, pki: Pki, gang_kind: GangKind
) -> None:
    # n1: eight 1-GPU pods. n2: one 4-GPU pod and 4 free GPUs. The 8-GPU gang (same priority as
    # everyone: no preemption) fits nowhere; n2 needs one pod to leave, n1 eight.
    gpu_node(fake_api, "n1")
    gpu_node(fake_api, "n2")
    for m in range(8):
        bound_elsewhere(fake_api, f"s{m}", "n1", [m])
    bound_elsewhere(fake_api, "wide", "n2", [0, 1, 2, 3])
    async with gang_world(fake_api, pki, starvation_bound=1.0) as w:
        await gang_kind.create_group(w, "big", 1)
        await w.admission.create_pod(gang_kind.member("big0", "big", gpus=8))
        await until(lambda: waiting(w, "big", gang_kind).get("reason") == "HoldingRoom", 10)
        assert "holding the room on n2 as 1 pod(s) there finish" in waiting(w, "big", gang_kind)["message"]
        assert any("waited longer than 1s" in n for n in w.notes_about("big", "PodGroup"))
        # A 1-GPU pod finishes on n1; a new small pod takes that GPU, not one of n2's held four.
        await w.admission.delete_pod("s0")
        await w.admission.create_pod(member("late", gpus=1))
        await until(lambda: node_of(w.pods()["late"]) == "n1", 10)
        assert not node_of(w.pods()["big0"])  # held room is not free room: "wide" still runs there
        await w.admission.delete_pod("wide")
        await until(lambda: node_of(w.pods()["big0"]) == "n2", 10)
        assert double_booked(w.fake.list_objects("pods", "default")) == []


async def test_without_the_bound_the_small_pod_takes_the_room(fake_api: FakeApiServer, pki: Pki) -> None:
    gpu_node(fake_api, "n2")
    bound_elsewhere(fake_api, "wide", "n2", [0, 1, 2, 3])
    async with gang_world(fake_api, pki, starvation_bound=0.0) as w:
        await w.admission.create_podgroup(podgroup("big", 1))
        await w.admission.create_pod(member("big0", group="big", gpus=8))
        await until(lambda: waiting(w, "big").get("reason") == "InsufficientResources", 10)
        await w.admission.create_pod(member("late", gpus=1))
        await until(lambda: node_of(w.pods()["late"]) == "n2", 10)
