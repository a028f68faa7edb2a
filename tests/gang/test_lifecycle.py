"""A gang's life when things go wrong: no room until a timeout, a member deleted while its gang is
being placed, the allocator restarted half-way through releasing a gang."""

from __future__ import annotations

from typing import Any

import pytest

from apis import keys
from tests.gang.harness import (
    allocator_front,
    bound_elsewhere,
    gang_runner,
    gang_settings,
    gang_world,
    gates_of,
    gpu_node,
    member,
    node_of,
    podgroup,
)
from tests.support.allocator_harness import double_booked, running_allocator
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Pki
from tests.support.polling import until


async def test_a_gang_larger_than_the_cluster_times_out_cleanly(fake_api: FakeApiServer, pki: Pki) -> None:
    gpu_node(fake_api, "n1")
    async with gang_world(fake_api, pki) as w:
        await w.admission.create_podgroup(podgroup("big", 3, timeout=2))
        for i in range(3):  # 3 x 4 GPUs on an 8-GPU cluster
            await w.admission.create_pod(member(f"big{i}", group="big", gpus=4))
        await until(lambda: w.podgroup_status("big").get("phase") == "PreScheduling", 5)
        assert w.gang_reservations() == {}  # waiting, it holds nothing
        assert w.service.metrics.registry.get_sample_value("topoalloc_podgroup_waiting_pods") == 3
        await until(lambda: w.podgroup_status("big").get("phase") == "Failed", 6)
        status = w.podgroup_status("big")
        assert status.get("scheduled", 0) == 0 and status["scheduleStartTime"]
        await until(lambda: any("timeout" in n for n in w.notes_about("big", "PodGroup")), 5)
        failed = [n for n in w.notes_about("big", "PodGroup") if "timeout" in n]
        assert failed[0].startswith("no placement for the whole gang within its 2s timeout: ")
        assert w.service.metrics.registry.get_sample_value("topoalloc_podgroup_scheduling_timeout_total") == 1
        assert w.gang_reservations() == {} and w.service.cache.ledger.holds == {}
        pods = w.pods()
        assert all(gates_of(pods[f"big{i}"]) == [keys.GANG_SCHEDULING_GATE] for i in range(3))
        # Nothing is held: an ordinary pod gets all 8 GPUs.
        await w.admission.create_pod(member("whole-node", gpus=8))
        await until(lambda: node_of(w.pods()["whole-node"]) == "n1", 5)
        await gang_runner(w).wait_passes(2)
        assert w.podgroup_status("big").get("phase") == "Failed"  # and it stays failed
        for i in range(3):  # until its members are gone: the next ones start afresh
            await w.admission.delete_pod(f"big{i}")
        await until(lambda: w.podgroup_status("big").get("phase") == "Pending", 5)
        assert "scheduleStartTime" not in w.podgroup_status("big")


async def test_a_member_deleted_in_flight_releases_the_plan_which_is_made_again(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    gpu_node(fake_api, "n1")
    gpu_node(fake_api, "n2")
    # kube-scheduler gets to m0 at once and to the others only when the test says so.
    async with gang_world(fake_api, pki, hold={"m1", "m2", "m3"}) as w:
        await w.admission.create_podgroup(podgroup("job", 4))
        for i in range(4):  # 4 x 4 GPUs: the whole cluster
            await w.admission.create_pod(member(f"m{i}", group="job", gpus=4))
        await until(lambda: node_of(w.pods()["m0"]) != "", 10)
        await until(lambda: all(not gates_of(p) for p in w.pods().values()), 5)
        await until(lambda: set(w.gang_reservations()) == {"default/m1", "default/m2", "default/m3"}, 5)

        await w.admission.delete_pod("m2")  # before it was bound
        await until(lambda: w.gang_reservations() == {}, 5)  # the whole plan is released
        await until(lambda: any("left before it was bound" in n for n in w.notes_about("job", "PodGroup")), 5)
        await until(lambda: w.podgroup_status("job").get("phase") == "Pending", 5)  # 3 of 4 members

        # Released but unplanned members reach the extender: it holds them for their gang.
        w.scheduler.release("m1", "m3")
        await until(
            lambda: w.scheduler.attempts["default/m1"] > 0 and w.scheduler.attempts["default/m3"] > 0, 5
        )
        await gang_runner(w).wait_passes(2)
        pods = w.pods()
        assert not node_of(pods["m1"]) and not node_of(pods["m3"])
        assert "held for gang default/job" in next(iter(w.scheduler.filtered_out["default/m1"].values()))

        await w.admission.create_pod(member("m4", group="job", gpus=4))  # the Job's replacement
        await until(lambda: all(node_of(p) for p in w.pods().values()), 10)
        assert double_booked(w.fake.list_objects("pods", "default")) == []
        await until(lambda: w.gang_reservations() == {}, 5)  # once the watch shows the binds
        await until(lambda: w.podgroup_status("job").get("phase") == "Scheduled", 5)


async def test_restart_mid_gang_redoes_the_plan_and_binds_nothing_against_the_old_one(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    gpu_node(fake_api, "n1")
    gpu_node(fake_api, "n2")
    members = [f"m{i}" for i in range(4)]
    # The first allocator plans the gang and dies after releasing only m0 and m1: the gate
    # removals of m2 and m3 fail, and kube-scheduler has not reached any of them yet.
    faults = [
        fake_api.inject_fault("PATCH", f"/pods/{name}$", status=503, times=None) for name in ("m2", "m3")
    ]
    async with (
        running_allocator(fake_api, pki, gang=gang_settings()) as first,
        allocator_front(fake_api, pki, first, hold=set(members)) as w,
    ):
        await w.admission.create_podgroup(podgroup("job", 4))
        for name in members:
            await w.admission.create_pod(member(name, group="job", gpus=4))
        await until(lambda: not gates_of(w.pods()["m0"]) and not gates_of(w.pods()["m1"]), 10)
        await until(lambda: all(f.hits for f in faults), 5)
        assert set(w.gang_reservations()) == {f"default/{m}" for m in members}
    fake_api.clear_faults()
    # While no allocator runs, another pod takes half of a node: the old plan no longer fits.
    bound_elsewhere(fake_api, "squatter", "n1", [0, 1, 2, 3])

    async with gang_world(fake_api, pki) as w:  # the restarted allocator, kube-scheduler unblocked
        await until(
            lambda: w.scheduler.attempts["default/m0"] > 1 and w.scheduler.attempts["default/m1"] > 1, 10
        )
        await until(lambda: w.podgroup_status("job").get("phase") == "PreScheduling", 5)
        pods = w.pods()
        assert not any(node_of(pods[m]) for m in members)  # m0, m1 reach the extender and wait
        assert w.gang_reservations() == {}
        assert gates_of(pods["m2"]) == [keys.GANG_SCHEDULING_GATE]

        await w.admission.delete_pod("squatter")
        # The binding reaches the API before the kube-scheduler stand-in records its bind: wait for both.
        await until(
            lambda: all(node_of(w.pods()[m]) for m in members) and len(w.scheduler.binds) >= len(members), 10
        )
        pods = w.pods()
        assert double_booked(pods.values()) == []
        assert sorted(node_of(pods[m]) for m in members) == ["n1", "n1", "n2", "n2"]
        # Every bind went through the new plan: kube-scheduler bound each member once.
        assert sorted(k for k, _ in w.scheduler.binds) == [f"default/{m}" for m in members]
        assert all(
            pods[m]["metadata"]["annotations"][keys.GANG_PLANNED_NODE] == node_of(pods[m])
            for m in ("m0", "m1")
        )


async def test_a_status_write_that_broke_off_is_written_again(
    fake_api: FakeApiServer, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first write of a PodGroup's status fails with something the controller does not
    expect (not an API answer): the pass breaks off, and the next pass must not take the status
    it meant to write for written."""
    import allocator.gang.controller as controller

    real = controller.patch_podgroup_status
    calls: list[str] = []

    async def flaky(api: Any, target: Any, status: Any) -> bool:
        calls.append(target.name)
        if len(calls) == 1:
            raise RuntimeError("the connection pool broke")
        return await real(api, target, status)

    monkeypatch.setattr(controller, "patch_podgroup_status", flaky)
    gpu_node(fake_api, "n1")
    async with gang_world(fake_api, pki) as w:
        await w.admission.create_podgroup(podgroup("job", 2))
        await w.admission.create_pod(member("job0", group="job", gpus=4))  # 1 of 2: waits
        await until(lambda: len(calls) >= 1, 5)
        # another gang's event makes another pass; "job" itself has not changed
        await w.admission.create_podgroup(podgroup("other", 2))
        await w.admission.create_pod(member("other0", group="other", gpus=4))
        await until(lambda: w.podgroup_status("job").get("phase") == "Pending", 5)
        assert calls[0] == "job"
