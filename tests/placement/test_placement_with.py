"""Placement mode with the other components: a gang placed whole on its plan, a room's owner on its
room, a restarted allocator holding again what placed pods record, and preemption."""

from __future__ import annotations

from apis import keys
from apis.reservation_pod import RESERVATION_ALLOCATED
from tests.gang.harness import member, podgroup
from tests.placement.harness import allocated, gpu_node, placement_world
from tests.reservations.objects import reservation
from tests.support.allocator_harness import running_allocator
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Pki
from tests.support.polling import until

PG_PATH = "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/default/podgroups"


def bound(fake: FakeApiServer) -> dict[str, str]:
    return {
        p["metadata"]["name"]: p["spec"]["nodeName"]
        for p in fake.list_objects("pods")
        if p["spec"].get("nodeName")
    }


async def test_a_gang_is_placed_whole_on_its_plan(fake_api: FakeApiServer, pki: Pki) -> None:
    gpu_node(fake_api, "n1")
    gpu_node(fake_api, "n2")
    async with placement_world(fake_api, pki) as w:
        fake_api.put(podgroup("job", 2))
        first = await w.admission.create_pod(member("w0", group="job", gpus=8))
        gates = [g["name"] for g in first["spec"]["schedulingGates"]]
        assert gates == [keys.GANG_SCHEDULING_GATE, keys.PLACEMENT_GATE]
        await w.runner.wait_passes(2)
        assert "w0" not in bound(fake_api)  # 1 of 2: the gang waits, placement with it
        await w.admission.create_pod(member("w1", group="job", gpus=8))
        await until(lambda: len(bound(fake_api)) == 2, what="the gang bound")
        nodes = bound(fake_api)
        assert sorted(nodes.values()) == ["n1", "n2"]
        for name, node in nodes.items():
            assert allocated(w.pod(name)) == (node, list(range(8)))


async def test_a_rooms_owner_is_placed_in_its_room(fake_api: FakeApiServer, pki: Pki) -> None:
    gpu_node(fake_api, "n1")
    gpu_node(fake_api, "n2")
    fake_api.put(
        reservation(
            "room", gpus=2, owners=[{"labelSelector": {"matchLabels": {"app": "owner"}}}], allocateOnce=False
        )
    )
    async with placement_world(fake_api, pki) as w:
        await until(lambda: (fake_api.get("reservations", "room").get("status") or {}).get("phase") == "Available",
                    what="the room placed")  # fmt: skip
        room = fake_api.get("reservations", "room")
        room_node = room["status"]["nodeName"]
        held = allocated(room)[1]
        await w.admission.create_pod(member("own", gpus=2, labels={"app": "owner"}))
        await until(lambda: "own" in bound(fake_api), what="the owner bound")
        assert allocated(w.pod("own")) == (room_node, held)
        assert RESERVATION_ALLOCATED in w.pod("own")["metadata"]["annotations"]


async def test_a_new_allocator_holds_again_what_placed_pods_record(fake_api: FakeApiServer, pki: Pki) -> None:
    gpu_node(fake_api, "n1")
    async with placement_world(fake_api, pki) as w:
        w.scheduler.held.add("a")  # placed, not bound yet when the allocator goes
        await w.admission.create_pod(member("a", gpus=4))
        await until(lambda: allocated(w.pod("a"))[0], what="a placed")
        first = allocated(w.pod("a"))[1]
    async with placement_world(fake_api, pki) as w:
        w.scheduler.held.add("a")
        await w.runner.wait_passes(2)
        assert w.run.service.cache.ledger.holds["default/a"].node == "n1"  # held again as recorded
        await w.admission.create_pod(member("b", gpus=4))
        await until(lambda: "b" in bound(fake_api), what="b bound")
        assert not set(allocated(w.pod("b"))[1]) & set(first)  # never a's GPUs


async def test_a_pod_that_fits_only_by_evicting_lower_priority_pods_gets_them_evicted(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    gpu_node(fake_api, "n1")
    async with placement_world(fake_api, pki) as w:
        for i in range(2):
            await w.admission.create_pod(member(f"low{i}", gpus=4, priority=0))
        await until(lambda: len(bound(fake_api)) == 2, what="the low pods bound")
        await w.admission.create_pod(member("high", gpus=8, priority=1000))
        await until(lambda: all(fake_api.get("pods", f"low{i}", "default") is None
                                or fake_api.get("pods", f"low{i}", "default")["metadata"].get("deletionTimestamp")
                                for i in range(2)), what="the low pods evicted")  # fmt: skip
        for i in range(2):  # no kubelet: the terminating pods go once deleted
            fake_api.remove("pods", f"low{i}", "default")
        await until(lambda: "high" in bound(fake_api), what="high bound")
        assert any(e["reason"] == "Preempting" for e in w.events_about("high"))


async def test_without_placement_no_pod_is_gated(fake_api: FakeApiServer, pki: Pki) -> None:
    async with running_allocator(fake_api, pki) as run:
        assert "placement" not in [c.name for c in run.service.components]
