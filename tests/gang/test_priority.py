"""Waiting gangs are served by priority (spec.priority, the PriorityClass value), then age."""

from __future__ import annotations

from allocator.core.gang.priority import by_priority, gang_priority
from tests.gang.harness import gang_world, gpu_node, member, node_of
from tests.gang.native import GangKind
from tests.support.allocator_harness import double_booked
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Pki
from tests.support.polling import until


async def test_the_younger_higher_priority_gang_goes_first_when_room_frees(
    fake_api: FakeApiServer, pki: Pki, gang_kind: GangKind
) -> None:
    gpu_node(fake_api, "n1")
    # Without preemption, so both gangs wait for the filler to leave on its own.
    async with gang_world(fake_api, pki, preemption=False) as w:
        await w.admission.create_pod(member("filler", gpus=8))
        await until(lambda: node_of(w.pods()["filler"]) == "n1", 10)
        # "old" (priority 10) has waited longer than "new" (priority 1000); each needs 6 GPUs.
        await gang_kind.create_group(w, "old", 3)
        for i in range(3):
            await w.admission.create_pod(gang_kind.member(f"old{i}", "old", gpus=2, priority=10))
        await until(lambda: gang_kind.status(w, "old").get("phase") == "PreScheduling", 5)
        await gang_kind.create_group(w, "new", 3)
        for i in range(3):
            await w.admission.create_pod(gang_kind.member(f"new{i}", "new", gpus=2, priority=1000))
        await until(lambda: gang_kind.status(w, "new").get("phase") == "PreScheduling", 5)
        await w.admission.delete_pod("filler")

        def bound(prefix: str) -> int:
            return sum(1 for n, p in w.pods().items() if n.startswith(prefix) and node_of(p))

        await until(lambda: bound("new") == 3, 10)
        assert bound("old") == 0  # oldest-first would have placed "old"
        assert double_booked(w.fake.list_objects("pods", "default")) == []


def test_queue_order_is_priority_then_age_then_name() -> None:
    gangs = [("a", 5, 30.0), ("b", 100, 50.0), ("c", 5, 10.0), ("d", 100, 50.0)]
    order = by_priority(gangs, lambda g: g[1], lambda g: g[2], lambda g: g[0])
    assert [g[0] for g in order] == ["b", "d", "c", "a"]
    assert gang_priority([100, 7, 50]) == 7 and gang_priority([]) == 0
