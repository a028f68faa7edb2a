"""Placement decided at admission, end to end on the fake API server: on the leader, a controller's
pod is created already pinned to its node with its devices recorded and no gate, kube-scheduler
(the stand-in) binds it, and the allocator writes nothing to it; its devices are held ahead from the
decision until the pod shows up, then as its own; never a device twice, also for a burst decided
before any watch event; whatever the route cannot settle there is gated as before."""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import jsonpatch

from allocator.placement.webhook import GATE_PATH, PATH
from allocator.placement.writes import pinned_to
from apis import keys
from apis.reservation_pod import RESERVATION_ALLOCATED
from tests.placement.harness import PlacementWorld, allocated, gpu_node, gpu_pod, placement_world
from tests.reservations.objects import reservation
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Pki
from tests.support.polling import until

JSON = dict[str, Any]
JOB = {"apiVersion": "batch/v1", "kind": "Job", "name": "job", "uid": "job-uid", "controller": True}
GATED = [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": keys.PLACEMENT_GATE}]}]


def owned(gpus: int = 1, owner: JSON = JOB, name: str = "", **extra: Any) -> JSON:
    """A pod as its controller creates it: generateName and no name (a StatefulSet's has a name),
    no uid."""
    pod = gpu_pod("", gpus, **extra)
    pod["metadata"] = {"namespace": "default", "ownerReferences": [owner]}
    pod["metadata"].update({"name": name} if name else {"generateName": "job-"})
    return pod


def review(w: PlacementWorld, pod: JSON, path: str = PATH, **request: Any) -> tuple[list[JSON], JSON]:
    """The placement route's answer to the pod's creation (called in-process, as the admission
    server does): its patch and the pod as patched."""
    route = w.run.service.component("placement").routes()[path]  # type: ignore[attr-defined]
    answer = route({"uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "namespace": "default", "operation": "CREATE", "object": pod, **request})  # fmt: skip
    assert answer["allowed"]
    ops = json.loads(base64.b64decode(answer["patch"])) if "patch" in answer else []
    return ops, jsonpatch.apply_patch(pod, ops) if ops else pod


def ahead(w: PlacementWorld) -> list[str]:
    return [k for k in w.run.service.cache.ledger.holds if k.startswith("admission:")]


def admissions(w: PlacementWorld, result: str, reason: str) -> float:
    registry = w.run.service.metrics.registry
    got = registry.get_sample_value(
        "topoalloc_placement_admissions_total", {"result": result, "reason": reason}
    )
    return got or 0.0


async def test_a_controllers_pod_is_created_pinned_with_its_devices_and_bound_there(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    gpu_node(fake_api, "n1")
    gpu_node(fake_api, "n2")
    async with placement_world(fake_api, pki) as w:
        await w.runner.wait_passes(1)  # leading: the route may decide
        await w.scheduler.stop()  # kube-scheduler binds it once its hold is seen to be the pod's
        created = await w.admission.create_pod(owned(2))
        name, uid = created["metadata"]["name"], created["metadata"]["uid"]
        assert not created["spec"].get("schedulingGates")
        node, minors = allocated(created)
        assert (
            pinned_to(created, node)
            and len(minors) == 2
            and minors[0] % 2 == 0
            and minors[1] == minors[0] + 1
        )
        ledger = w.run.service.cache.ledger
        await until(lambda: f"default/{name}" in ledger.holds, what="the hold ahead taken up by the pod")
        hold = ledger.holds[f"default/{name}"]
        assert (hold.uid, hold.node, hold.annotation) == (
            uid,
            node,
            created["metadata"]["annotations"][keys.DEVICE_ALLOCATED],
        )
        assert ahead(w) == [] and ledger.ahead == {}
        await w.scheduler.start()
        await until(lambda: w.pod(name)["spec"].get("nodeName"), what="bound")
        assert w.scheduler.binds == [(name, node)]
        await until(lambda: f"default/{name}" not in ledger.holds, what="its own annotation counting")
        # The pod cost its creation and its binding alone: the allocator wrote nothing to it.
        writes = [
            r
            for r in fake_api.requests()
            if r.method in ("PATCH", "PUT", "POST") and f"/pods/{name}" in r.path
        ]
        assert writes == []
        assert admissions(w, "decided", "") == 1
        # The next pod never gets its GPUs.
        second = await w.admission.create_pod(owned(2))
        node2, minors2 = allocated(second)
        assert not second["spec"].get("schedulingGates") and (node2 != node or not set(minors2) & set(minors))


async def test_a_burst_decided_before_any_watch_event_never_shares_a_device(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    gpu_node(fake_api, "n1")
    gpu_node(fake_api, "n2")
    async with placement_world(fake_api, pki) as w:
        await w.runner.wait_passes(1)
        # One after another without yielding to the event loop: no watch event can arrive between.
        answers = [review(w, owned(1)) for _ in range(17)]
        placed = [pod for ops, pod in answers if ops != GATED]
        assert len(placed) == 16 and answers[-1][0] == GATED  # 16 GPUs: the 17th waits, gated
        used = [(allocated(p)[0], m) for p in placed for m in allocated(p)[1]]
        assert len(used) == len(set(used)) == 16
        assert all(pinned_to(p, allocated(p)[0]) for p in placed)
        assert len(ahead(w)) == 16 and admissions(w, "gated", "no_room") == 1
        # Created (the route called again on each: placed already, nothing more held), each hold
        # ahead becomes its pod's.
        names = []
        for pod in placed:
            created = await w.admission.create_pod(pod)
            assert allocated(created) == allocated(pod) and not created["spec"].get("schedulingGates")
            names.append(created["metadata"]["name"])
        assert len(ahead(w)) <= 16
        ledger = w.run.service.cache.ledger
        await until(lambda: not ahead(w), what="every hold ahead taken up")
        await until(lambda: all(w.pod(n)["spec"].get("nodeName") for n in names), what="all bound")
        for n in names:
            pod = w.pod(n)
            assert pod["spec"]["nodeName"] == allocated(pod)[0]
        await until(lambda: not ledger.holds, what="all counted by their own annotations")
        assert admissions(w, "decided", "") == 16


async def test_the_route_called_again_makes_no_second_decision(fake_api: FakeApiServer, pki: Pki) -> None:
    gpu_node(fake_api, "n1")
    async with placement_world(fake_api, pki) as w:
        await w.runner.wait_passes(1)
        ops, pod = review(w, owned(1))
        assert ops and len(ahead(w)) == 1
        # A later webhook changed the pod (a label): the API server calls the route again.
        pod["metadata"]["labels"] = {"sidecar": "injected"}
        again, same = review(w, pod)
        assert again == [] and same == pod and len(ahead(w)) == 1


async def test_what_the_route_cannot_settle_is_gated_as_before(fake_api: FakeApiServer, pki: Pki) -> None:
    gpu_node(fake_api, "n1")
    async with placement_world(fake_api, pki) as w:
        await w.runner.wait_passes(1)
        bare = gpu_pod("", 1)
        bare["metadata"] = {"generateName": "bare-", "namespace": "default"}
        gated_by_queue = owned(1, schedulingGates=[{"name": "kueue.x-k8s.io/admission"}])
        member = owned(1)
        member["metadata"]["labels"] = {keys.POD_GROUP_LABEL: "gang"}
        recorded = owned(1)
        recorded["metadata"]["annotations"] = {keys.DEVICE_ALLOCATED: '{"gpu":[{"minor":0}]}'}
        cases = [
            (bare, {}, GATED, ("gated", "no_controller")),  # pinned by nomination: not at creation
            (owned(1), {"dryRun": True}, GATED, ("gated", "dry_run")),  # no side effects
            (
                gated_by_queue,
                {},
                [{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": keys.PLACEMENT_GATE}}],
                ("gated", "other_gate"),
            ),
            (member, {}, GATED, ("gated", "group")),  # its gang's plan decides
            (recorded, {}, GATED, ("gated", "recorded")),
        ]
        for pod, request, expected, counted in cases:
            assert review(w, pod, **request)[0] == expected, (pod, request)
            assert admissions(w, *counted) == 1, counted
        assert ahead(w) == []
        # Pinned by nomination for every pod (`placement.pin: nominate`): nothing at creation.
        w.run.service.component("placement").admission.settings.pin = "nominate"  # type: ignore[attr-defined]
        assert review(w, owned(1))[0] == GATED and admissions(w, "gated", "pin") == 1
        w.run.service.component("placement").admission.settings.pin = "auto"  # type: ignore[attr-defined]
        # The fallback entry's route (any replica, the leader not answering) only gates.
        assert review(w, owned(1), GATE_PATH)[0] == GATED and ahead(w) == []
        # A standby (or a leader that lost its Lease) gates.
        runner = w.runner
        runner.is_leader = lambda: False
        assert review(w, owned(1))[0] == GATED and admissions(w, "gated", "standby") == 1
        assert ahead(w) == []


async def test_devices_held_for_a_pod_never_created_are_let_go_after_the_ttl(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    gpu_node(fake_api, "n1")
    async with placement_world(fake_api, pki, admission_hold_ttl=30.0) as w:
        await w.runner.wait_passes(1)
        ops, pod = review(w, owned(8))
        assert ops != GATED and len(ahead(w)) == 1
        assert review(w, owned(8))[0] == GATED  # the node's GPUs are held for the first
        ledger = w.run.service.cache.ledger
        clock = ledger.clock
        ledger.clock = lambda: clock() + 29.0
        assert ledger.expire() == 0 and len(ahead(w)) == 1
        ledger.clock = lambda: clock() + 31.0  # its creation was refused after admission
        assert ledger.expire() == 1 and ahead(w) == []
        again, placed = review(w, owned(8))
        assert again != GATED and allocated(placed) == allocated(pod)


async def test_a_pod_refused_where_it_was_placed_makes_its_controllers_next_pod_keep_off(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    gpu_node(fake_api, "n1")
    gpu_node(fake_api, "n2")
    owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "rs-uid", "controller": True}
    async with placement_world(fake_api, pki) as w:
        await w.runner.wait_passes(1)
        w.scheduler.held.add("rs-0")
        first = await w.admission.create_pod(owned(8, owner, name="rs-0"))
        node = allocated(first)[0]
        assert not first["spec"].get("schedulingGates") and pinned_to(first, node)
        name = first["metadata"]["name"]
        w.scheduler.refuse = {node: "1 node(s) had volume node affinity conflict"}
        w.scheduler.held.clear()
        await until(lambda: fake_api.get("pods", name, "default") is None, what="evicted")
        assert any(e["reason"] == "Replacing" for e in w.events_about(name))
        again = await w.admission.create_pod(owned(8, owner))  # the ReplicaSet creates it anew
        assert not again["spec"].get("schedulingGates") and allocated(again)[0] not in ("", node)


async def test_a_new_leader_decides_at_admission_only_once_it_holds_what_placed_pods_record(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    gpu_node(fake_api, "n1")
    async with placement_world(fake_api, pki) as w:
        await w.runner.wait_passes(1)
        await w.scheduler.stop()  # placed, not bound yet
        created = await w.admission.create_pod(owned(4))
        name = created["metadata"]["name"]
        ledger = w.run.service.cache.ledger
        await until(lambda: f"default/{name}" in ledger.holds, what="held as the pod's")
        controller = w.run.service.component("placement").controller  # type: ignore[attr-defined]
        ops, _ = review(w, owned(1))  # a hold ahead, then leadership lost: all let go
        assert ops != GATED
        controller.step_down()
        assert not ledger.holds and controller.unheld == {f"default/{name}"}
        assert review(w, owned(4))[0] == GATED and admissions(w, "gated", "standby") == 1
        await w.runner.wait_passes(2)  # leading again: a pass holds the recorded devices again
        assert ledger.holds[f"default/{name}"].node == "n1" and not controller.unheld
        ops, other = review(w, owned(4))
        assert ops != GATED and not set(allocated(other)[1]) & set(allocated(created)[1])


async def test_a_rooms_owner_is_placed_in_its_room_at_admission(fake_api: FakeApiServer, pki: Pki) -> None:
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
        await w.runner.wait_passes(1)
        room = fake_api.get("reservations", "room")
        owner = owned(2, name="owner-0")
        owner["metadata"]["labels"] = {"app": "owner"}
        w.scheduler.held.add("owner-0")  # placed, not bound yet
        created = await w.admission.create_pod(owner)
        assert not created["spec"].get("schedulingGates")
        assert allocated(created) == (room["status"]["nodeName"], allocated(room)[1])
        assert RESERVATION_ALLOCATED in created["metadata"]["annotations"]
        book = w.run.service.component("reservations").book  # type: ignore[attr-defined]
        key = f"default/{created['metadata']['name']}"
        await until(lambda: list(book.pending["room"]) == [key], what="the room's take moved to the pod")
        assert key in w.run.service.cache.ledger.holds and ahead(w) == []
        w.scheduler.held.clear()
        await until(lambda: w.pod("owner-0")["spec"].get("nodeName"), what="bound")
        await until(lambda: not book.pending["room"], what="the take counted as the bound owner's")
        # Another owner finds the room taken: placed elsewhere, never on the same GPUs.
        other = owned(2)
        other["metadata"]["labels"] = {"app": "owner"}
        second = await w.admission.create_pod(other)
        where, gpus = allocated(second)
        assert where and (where != allocated(created)[0] or not set(gpus) & set(allocated(created)[1]))
