"""A high-priority gang that fits nowhere makes room by evicting lower-priority pods: the real
allocator (gang controller, extender, holds) against the fake API server with the kube-scheduler
stand-in. A small "kubelet" task finishes pods once they are Terminating (without it a deleted
bound pod stays Terminating for ever, as on a control plane without kubelets)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from apis import keys
from tests.gang.harness import (
    RACK,
    GangWorld,
    bound_elsewhere,
    condition,
    gang_world,
    gates_of,
    gpu_node,
    member,
    node_of,
    podgroup,
)
from tests.gang.native import GangKind
from tests.support.allocator_harness import double_booked
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Pki
from tests.support.polling import until

JSON = dict[str, Any]
HIGH = 1000


def fill(api: FakeApiServer, node: str, priority: int = 0, labels: dict[str, str] | None = None) -> None:
    for m in range(8):
        bound_elsewhere(api, f"f-{node}-{m}", node, [m], priority=priority, labels=labels)


def high_member(name: str, group: str, gpus: int) -> JSON:
    return member(name, group=group, gpus=gpus, priority=HIGH)


def terminating(w: GangWorld) -> set[str]:
    return {n for n, p in w.pods().items() if p["metadata"].get("deletionTimestamp")}


@asynccontextmanager
async def kubelet(w: GangWorld, finished: set[str]) -> AsyncIterator[None]:
    """Deletes Terminating pods for good (records their names in `finished`)."""

    async def loop() -> None:
        while True:
            for name in terminating(w):
                finished.add(name)
                await w.admission.delete_pod(name)
            await asyncio.sleep(0.05)

    task = asyncio.create_task(loop())
    try:
        yield
    finally:
        task.cancel()


async def test_a_high_priority_gang_evicts_exactly_one_racks_worth_and_binds_there(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    racks = {"n1": "r1", "n2": "r1", "n3": "r2", "n4": "r2", "n5": "r3"}
    for name, rack in racks.items():
        gpu_node(fake_api, name, {RACK: rack})
        fill(fake_api, name)
    async with gang_world(fake_api, pki) as w:
        gone: set[str] = set()
        async with kubelet(w, gone):
            await w.admission.create_podgroup(podgroup("train", 2))
            for i in range(2):
                await w.admission.create_pod(high_member(f"train{i}", "train", 8))
            await until(lambda: all(node_of(w.pods().get(f"train{i}", {})) for i in range(2)), 15)
        nodes = {node_of(w.pods()[f"train{i}"]) for i in range(2)}
        assert len(nodes) == 2 and len({racks[n] for n in nodes}) == 1  # two whole nodes of one rack
        assert gone == {f"f-{n}-{m}" for n in nodes for m in range(8)}  # those 16, nothing else
        assert double_booked(w.fake.list_objects("pods", "default")) == []
        await until(lambda: w.podgroup_status("train").get("phase") == "Scheduled", 5)
        notes = w.notes_about("train", "PodGroup")
        assert any(n.startswith("preempting 16 lower-priority pod(s) on ") for n in notes), notes


async def test_a_running_gang_goes_whole_and_equal_priority_stays(fake_api: FakeApiServer, pki: Pki) -> None:
    # n1: a running 2-member gang (4 GPUs each, priority 0). n2: eight 1-GPU pods of priority
    # 1000 (equal to the preemptor's: untouchable). A 1-member gang needing 4 GPUs: one member
    # of "job" would free them, but only the whole gang may go.
    gpu_node(fake_api, "n1")
    gpu_node(fake_api, "n2")
    for i in range(2):
        bound_elsewhere(fake_api, f"job{i}", "n1", [4 * i + m for m in range(4)], priority=0, group="job")
    fill(fake_api, "n2", HIGH)
    fake_api.put(podgroup("job", 2))
    async with gang_world(fake_api, pki) as w:
        gone: set[str] = set()
        async with kubelet(w, gone):
            await w.admission.create_podgroup(podgroup("solo", 1))
            await w.admission.create_pod(high_member("solo0", "solo", 4))
            await until(lambda: node_of(w.pods().get("solo0", {})) == "n1", 15)
        assert gone == {"job0", "job1"}
        assert double_booked(w.fake.list_objects("pods", "default")) == []


async def test_equal_priority_is_never_preempted(fake_api: FakeApiServer, pki: Pki) -> None:
    gpu_node(fake_api, "n1")
    fill(fake_api, "n1", HIGH)
    async with gang_world(fake_api, pki) as w:
        await w.admission.create_podgroup(podgroup("peer", 1))
        await w.admission.create_pod(high_member("peer0", "peer", 2))
        await until(lambda: w.podgroup_status("peer").get("phase") == "PreScheduling", 5)
        gang: Any = w.service.component("gang")
        await gang.controller.runner.wait_passes(2)  # the controller looked again since
        assert terminating(w) == set() and gates_of(w.pods()["peer0"]) == [keys.GANG_SCHEDULING_GATE]


async def test_a_pdb_holds_the_eviction_and_the_held_room_is_not_taken(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    gpu_node(fake_api, "n1")
    gpu_node(fake_api, "n2")
    fill(fake_api, "n1", 0, labels={"app": "batch"})
    fill(fake_api, "n2", HIGH)
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "batch", "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": "batch"}}, "maxUnavailable": 1},
        "status": {"disruptionsAllowed": 0},
    }
    fake_api.put(pdb)
    async with gang_world(fake_api, pki, hold={"train0"}) as w:  # kube-scheduler waits for us
        gone: set[str] = set()
        async with kubelet(w, gone):
            await w.admission.create_podgroup(podgroup("train", 1))
            await w.admission.create_pod(high_member("train0", "train", 8))
            await until(lambda: bool(w.gang_reservations()), 10)  # the room on n1 is held
            gang: Any = w.service.component("gang")
            await gang.controller.runner.wait_passes(2)  # the controller looked again since
            assert gone == set() and not node_of(w.pods()["train0"])  # the budget allows nothing
            registry = w.service.metrics.registry
            assert registry.get_sample_value("topoalloc_gang_held_devices") == 8
            assert registry.get_sample_value("topoalloc_gangs_waiting", {"reason": "Preempting"}) == 1
            waiting = next(c for c in w.podgroup_status("train")["conditions"] if c["type"] == "Waiting")
            assert waiting["reason"] == "Preempting" and "PodDisruptionBudget" in waiting["message"]
            preempting = next(
                c for c in w.podgroup_status("train")["conditions"] if c["type"] == "Preempting"
            )
            assert preempting["status"] == "True"
            # A budget that allows everything: the evictions go through and n1 is empty...
            pdb["status"] = {"disruptionsAllowed": 8}
            fake_api.put(pdb)
            await until(lambda: len(gone) == 8 and not terminating(w), 15)
            # ...but held for the gang: a small pod finds no room while the member is not bound.
            await w.admission.create_pod(member("sneak", gpus=1))
            await until(lambda: w.scheduler.attempts["default/sneak"] >= 1, 5)
            assert not node_of(w.pods()["sneak"])
            w.scheduler.release("train0")
            await until(lambda: node_of(w.pods().get("train0", {})) == "n1", 15)
        assert not node_of(w.pods()["sneak"])  # 8 GPUs of n1 went to the gang
        assert double_booked(w.fake.list_objects("pods", "default")) == []


async def test_a_restarted_allocator_continues_the_recorded_hold(
    fake_api: FakeApiServer, pki: Pki, gang_kind: GangKind
) -> None:
    # n1 and n2 full of priority-0 pods; a budget keeps them from leaving (so no plan goes around
    # it). The first allocator holds n1 for the gang (equal costs: by name) and records the hold
    # on the member.
    gpu_node(fake_api, "n1")
    gpu_node(fake_api, "n2")
    fill(fake_api, "n1", 0, labels={"app": "batch"})
    fill(fake_api, "n2", 0, labels={"app": "batch"})
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "batch", "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": "batch"}}},
        "status": {"disruptionsAllowed": 0},
    }
    fake_api.put(pdb)
    async with gang_world(fake_api, pki) as w:
        await gang_kind.create_group(w, "train", 1)
        await w.admission.create_pod(gang_kind.member("train0", "train", gpus=8, priority=HIGH))
        await until(lambda: keys.GANG_HOLD in (w.pods()["train0"]["metadata"].get("annotations") or {}), 10)
        assert w.gang_reservations() == {"default/train0": "n1"}
        assert gates_of(w.pods()["train0"]) == gang_kind.gates() and not node_of(w.pods()["train0"])
    # While no allocator runs, half of n2 finishes: a fresh plan would now evict only 4 pods there.
    for m in range(4):
        fake_api.remove("pods", f"f-n2-{m}", "default")
    async with gang_world(fake_api, pki) as w:
        gone: set[str] = set()
        async with kubelet(w, gone):
            await until(lambda: w.gang_reservations() == {"default/train0": "n1"}, 10)
            # the Event is written after the hold is taken (the event sink posts it on its own)
            await until(
                lambda: any("continuing the hold on n1" in n for n in w.notes_about("train", "PodGroup")), 5
            )
            pdb["status"] = {"disruptionsAllowed": 8}
            fake_api.put(pdb)
            await until(lambda: node_of(w.pods().get("train0", {})) == "n1", 15)
        assert gone == {f"f-n1-{m}" for m in range(8)}  # nothing on n2
        annotations = w.pods()["train0"]["metadata"].get("annotations") or {}
        await until(
            lambda: keys.GANG_HOLD not in (w.pods()["train0"]["metadata"].get("annotations") or {}), 5
        )
        assert keys.DEVICE_ALLOCATED in annotations


async def test_victims_that_do_not_leave_in_time_give_the_hold_up(fake_api: FakeApiServer, pki: Pki) -> None:
    gpu_node(fake_api, "n1")
    fill(fake_api, "n1", 0, labels={"app": "batch"})
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "batch", "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": "batch"}}},
        "status": {"disruptionsAllowed": 0},
    }
    fake_api.put(pdb)
    async with gang_world(fake_api, pki, preemption_timeout=1.0) as w:
        await w.admission.create_podgroup(podgroup("train", 1))
        await w.admission.create_pod(high_member("train0", "train", 8))

        def record() -> str:
            annotations = w.pods()["train0"]["metadata"].get("annotations") or {}
            return str(json.loads(annotations.get(keys.GANG_HOLD) or "{}").get("plan") or "")

        await until(lambda: bool(record()), 10)
        first = record()
        timed_out = ("topoalloc_gang_preemptions_total", {"result": "timed_out"})
        await until(lambda: (w.service.metrics.registry.get_sample_value(*timed_out) or 0) >= 1, 10)
        # The Event is written after the pass that gave up (Events are sent in the background).
        why = "did not leave within 1s (a PodDisruptionBudget allows no disruption now)"
        await until(lambda: any(why in n for n in w.notes_about("train", "PodGroup")), 5)
        # The hold and its record went; the next pass holds the room again under a new plan.
        await until(lambda: record() not in ("", first), 10)
        assert gates_of(w.pods()["train0"]) == [keys.GANG_SCHEDULING_GATE] and terminating(w) == set()


async def test_a_refused_eviction_re_plans_and_the_podgroup_says_so_in_order(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    """The cheapest victim (one 8-GPU pod on n1) is refused by a budget the allocator cannot see
    (a 429 it did not foresee, as with an allocator not allowed to read budgets): the gang goes
    around it to n2's eight pods, and the PodGroup's status writes, in the order the API took them,
    say the first plan, then the re-plan, then nothing once the room is made."""
    gpu_node(fake_api, "n1")
    gpu_node(fake_api, "n2")
    bound_elsewhere(fake_api, "keep", "n1", list(range(8)))
    fill(fake_api, "n2")
    fake_api.inject_fault(
        "POST", r"/pods/keep/eviction$", status=429, times=None, message="Cannot evict pod: budget"
    )
    status_path = "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/default/podgroups/train/status"
    async with gang_world(fake_api, pki) as w:
        gone: set[str] = set()
        async with kubelet(w, gone):
            await w.admission.create_podgroup(podgroup("train", 1))
            await w.admission.create_pod(high_member("train0", "train", 8))
            await until(lambda: node_of(w.pods().get("train0", {})) == "n2", 15)
            await until(lambda: w.podgroup_status("train").get("phase") == "Scheduled", 5)
        assert gone == {f"f-n2-{m}" for m in range(8)} and "keep" in w.pods()
    written = [
        condition(r.body["status"], "Preempting")
        for r in fake_api.requests("PATCH", status_path)
        if r.status == 200
    ]
    said = [c["message"] for c in written if c["status"] == "True"]
    assert said == [
        "1 lower-priority pod(s) evicted for the gang",
        "8 lower-priority pod(s) evicted for the gang; re-planned around 1 pod(s) whose eviction was refused",
    ]
    assert written[-1]["status"] == "False"
    assert condition(w.podgroup_status("train"), "Preempting")["status"] == "False"
