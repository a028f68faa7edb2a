"""A Reservation's life on the fake API server with the real allocator: rebuilt after a restart
from the API alone, Restricted rooms, the pod-count limit, expiry, a gang of Reservations placed all
at once or not at all and inside one domain of its required topology level, never on a DRA-mode
node, bad objects, the cpu a room holds, pods that must land in a reservation."""

from __future__ import annotations

import json
from typing import Any

import pytest

from allocator.runtime.gang_settings import GangSettings
from apis import dra, keys
from apis.annotations import DeviceAllocations
from apis.reservation_pod import RESERVATION_AFFINITY, RESERVATION_ALLOCATED
from tests.reservations.objects import reservation
from tests.support.allocations import entry
from tests.support.allocator_harness import allocated, device, node, pod, running_allocator, seed_nodes
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Pki
from tests.support.polling import until

# A whole DGX H100 GPU as the core writes it (gpu-memory filled in, protocol 4.2).
GPU = {
    "koordinator.sh/gpu-core": 100,
    "koordinator.sh/gpu-memory": 81559 * 2**20,
    "koordinator.sh/gpu-memory-ratio": 100,
}


def phase(fake: FakeApiServer, name: str) -> str:
    return str((fake.get("reservations", name).get("status") or {}).get("phase") or "")


def scheduled(fake: FakeApiServer, name: str) -> dict[str, Any]:
    conditions = (fake.get("reservations", name).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "Scheduled"), {})


def gpus(annotation: str | None) -> list[int]:
    return sorted(a["minor"] for a in json.loads(annotation or "{}").get("gpu") or [])


def owner(name: str, app: str, n: int, **kwargs: Any) -> dict[str, Any]:
    p = pod(name, gpus=n, **kwargs)
    p["metadata"]["labels"] = {"app": app}
    return p


def placed(name: str, node: str, minors: list[int], **spec: Any) -> dict[str, Any]:
    """A Reservation as the API holds it once placed: Available, its devices written."""
    body = reservation(name, gpus=len(minors), **spec)
    reserved = DeviceAllocations({"gpu": [entry(m, GPU) for m in minors]}).to_json()
    body["metadata"]["annotations"] = {keys.DEVICE_ALLOCATED: reserved}
    body["status"] = {"phase": "Available", "nodeName": node}
    return body


async def test_a_restart_rebuilds_rooms_and_owners_from_the_api(fake_api: FakeApiServer, pki: Pki) -> None:
    seed_nodes(fake_api, ["gpu-1"])
    fake_api.put(placed("room", "gpu-1", [0, 1, 2, 3], allocateOnce=False))
    first = owner("first", "room", 2, node_name="gpu-1")
    first["metadata"]["annotations"] = {
        keys.DEVICE_ALLOCATED: DeviceAllocations({"gpu": [entry(m, GPU) for m in (0, 1)]}).to_json(),
        RESERVATION_ALLOCATED: json.dumps({"name": "room"}),
    }
    fake_api.put(first)
    async with running_allocator(fake_api, pki) as run:
        # What is left of the room (GPUs 2, 3) is its owners' only: a stranger finds 4 GPUs free.
        stranger = fake_api.put(pod("stranger", gpus=8))
        assert (await run.client.filter(stranger, ["gpu-1"]))["NodeNames"] == []
        second = fake_api.put(owner("second", "room", 2))
        assert (await run.client.filter(second, ["gpu-1"]))["NodeNames"] == ["gpu-1"]
        assert await run.client.bind(second, "gpu-1") == ""
        assert gpus(allocated(fake_api.get("pods", "second", "default"))) == [2, 3]
        half = fake_api.put(pod("half", gpus=4))
        assert await run.client.bind(half, "gpu-1") == ""
        assert gpus(allocated(fake_api.get("pods", "half", "default"))) == [4, 5, 6, 7]
        await until(
            lambda: len(fake_api.get("reservations", "room")["status"].get("currentOwners") or []) == 2
        )


async def test_restricted_room_and_the_pod_count(fake_api: FakeApiServer, pki: Pki) -> None:
    seed_nodes(fake_api, ["gpu-1"])
    body = placed("limited", "gpu-1", [0, 1, 2, 3], allocateOnce=False, allocatePolicy="Restricted")
    body["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["pods"] = "2"
    fake_api.put(body)
    async with running_allocator(fake_api, pki) as run:
        for name in ("a", "b"):
            p = fake_api.put(owner(name, "limited", 1))
            assert await run.client.bind(p, "gpu-1") == ""
            stored = fake_api.get("pods", name, "default")
            assert (
                set(gpus(allocated(stored))) <= {0, 1, 2, 3}
                and RESERVATION_ALLOCATED in stored["metadata"]["annotations"]
            )
        # Two owners is its count: a third is placed as any pod, outside the room.
        third = fake_api.put(owner("c", "limited", 1))
        assert await run.client.bind(third, "gpu-1") == ""
        stored = fake_api.get("pods", "c", "default")
        assert (
            gpus(allocated(stored))[0] >= 4 and RESERVATION_ALLOCATED not in stored["metadata"]["annotations"]
        )


async def test_a_restricted_room_never_lends_an_owner_more(fake_api: FakeApiServer, pki: Pki) -> None:
    seed_nodes(fake_api, ["gpu-1"])
    fake_api.put(placed("small", "gpu-1", [0, 1], allocatePolicy="Restricted"))
    async with running_allocator(fake_api, pki) as run:
        required = owner("big", "small", 4, annotations={RESERVATION_AFFINITY: {"name": "small"}})
        required = fake_api.put(required)
        got = await run.client.filter(required, ["gpu-1"])
        assert got["NodeNames"] == [] and got["FailedNodes"]["gpu-1"].startswith("Reservation(s) ")
        assert "Reservation(s)" in await run.client.bind(required, "gpu-1")


async def test_expiry_gives_the_room_back(fake_api: FakeApiServer, pki: Pki) -> None:
    seed_nodes(fake_api, ["gpu-1"])
    fake_api.put(reservation("brief", gpus=8, ttl="1s"))
    async with running_allocator(fake_api, pki) as run:
        await until(lambda: phase(fake_api, "brief") == "Failed", timeout=15)
        ready = next(
            c for c in fake_api.get("reservations", "brief")["status"]["conditions"] if c["type"] == "Ready"
        )
        assert ready["reason"] == "Expired"
        p = fake_api.put(pod("after", gpus=8))
        await until(lambda: not run.service.cache.ledger.holds)
        assert (await run.client.filter(p, ["gpu-1"]))["NodeNames"] == ["gpu-1"]


async def test_a_gang_of_reservations_is_placed_whole_or_not_at_all(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    seed_nodes(fake_api, ["gpu-1", "gpu-2"])
    gang = {
        "labels": {"topoalloc.io/reservation-gang": "g"},
        "annotations": {"topoalloc.io/reservation-gang-size": "3"},
    }
    for i in range(2):
        fake_api.put(reservation(f"g-{i}", gpus=8, **gang))
    async with running_allocator(fake_api, pki):
        await until(lambda: scheduled(fake_api, "g-0").get("reason") == "GangIncomplete", timeout=10)
        fake_api.put(reservation("g-2", gpus=8, **gang))
        await until(lambda: scheduled(fake_api, "g-2").get("reason") == "Unschedulable", timeout=10)
        assert all(phase(fake_api, f"g-{i}") == "Pending" for i in range(3))  # none holds anything
        for i in range(3):
            assert keys.DEVICE_ALLOCATED not in (
                fake_api.get("reservations", f"g-{i}")["metadata"].get("annotations") or {}
            )
        fake_api.remove("reservations", "g-2")
        pair = {
            "labels": {"topoalloc.io/reservation-gang": "h"},
            "annotations": {"topoalloc.io/reservation-gang-size": "2"},
        }
        for i in range(2):
            fake_api.put(reservation(f"h-{i}", gpus=8, **pair))
        await until(lambda: phase(fake_api, "h-0") == phase(fake_api, "h-1") == "Available", timeout=10)
        nodes = {fake_api.get("reservations", f"h-{i}")["status"]["nodeName"] for i in range(2)}
        assert nodes == {"gpu-1", "gpu-2"}


async def test_reservations_of_devices_never_land_on_a_dra_mode_node(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    """A DRA-mode node hands its devices out through ResourceClaims only: a Reservation's room of
    device resources, alone or in a gang, is placed as a pod's would be, never there."""
    seed_nodes(fake_api, ["gpu-1"])
    fake_api.put(node("dra-1", labels={dra.MODE_LABEL: dra.MODE_DRA}))
    fake_api.put(device("dra-1"))
    fake_api.put(reservation("first", gpus=8))
    async with running_allocator(fake_api, pki):
        await until(lambda: phase(fake_api, "first") == "Available", timeout=10)
        assert fake_api.get("reservations", "first")["status"]["nodeName"] == "gpu-1"
        fake_api.put(reservation("second", gpus=1))
        await until(lambda: scheduled(fake_api, "second").get("reason") == "Unschedulable", timeout=10)
        assert "DRA mode" in scheduled(fake_api, "second")["message"]
        pair = {
            "labels": {"topoalloc.io/reservation-gang": "h"},
            "annotations": {"topoalloc.io/reservation-gang-size": "2"},
        }
        for i in range(2):
            fake_api.put(reservation(f"h-{i}", gpus=1, **pair))
        await until(lambda: scheduled(fake_api, "h-1").get("reason") == "Unschedulable", timeout=10)
        assert phase(fake_api, "h-0") == phase(fake_api, "h-1") == phase(fake_api, "second") == "Pending"


@pytest.mark.parametrize("gang_scheduling", [True, False], ids=["gang-profile", "own-profile"])
async def test_a_gang_of_reservations_keeps_to_its_required_topology_level(
    fake_api: FakeApiServer, pki: Pki, gang_scheduling: bool
) -> None:
    """As a gang of pods does (docs/topology.md): one domain of the level or none placed; with
    gang scheduling off too (the allocator then keeps a topology profile for Reservations)."""
    for name, rack in (("gpu-1", "r1"), ("gpu-2", "r2"), ("gpu-3", "r2")):
        fake_api.put(node(name, labels={"topoalloc.io/rack": rack}))
        fake_api.put(device(name))
    busy = pod("busy", gpus=1, node_name="gpu-3")  # rack r2 holds 15 free GPUs, not 16
    busy["metadata"]["annotations"] = {
        keys.DEVICE_ALLOCATED: DeviceAllocations({"gpu": [entry(0, GPU)]}).to_json()
    }
    fake_api.put(busy)
    gang = {
        "labels": {"topoalloc.io/reservation-gang": "g"},
        "annotations": {
            "topoalloc.io/reservation-gang-size": "2",
            keys.REQUIRED_TOPOLOGY: "topoalloc.io/rack",
        },
    }
    for i in range(2):
        fake_api.put(reservation(f"g-{i}", gpus=8, **gang))
    bad = {
        "labels": {"topoalloc.io/reservation-gang": "b"},
        "annotations": {"topoalloc.io/reservation-gang-size": "1", keys.REQUIRED_TOPOLOGY: "not a key"},
    }
    fake_api.put(reservation("b-0", gpus=1, **bad))
    settings = GangSettings(enabled=gang_scheduling)
    async with running_allocator(fake_api, pki, gang=settings):
        await until(lambda: scheduled(fake_api, "g-1").get("reason") == "Unschedulable", timeout=10)
        why = scheduled(fake_api, "g-1")["message"]
        assert "required" in why and "topoalloc.io/rack" in why, why
        assert phase(fake_api, "g-0") == phase(fake_api, "g-1") == "Pending"  # not across the racks
        await until(lambda: scheduled(fake_api, "b-0").get("reason") == "InvalidTopology", timeout=10)
        assert "Reservation b-0" in scheduled(fake_api, "b-0")["message"]
        fake_api.remove("pods", "busy", "default")
        await until(lambda: phase(fake_api, "g-0") == phase(fake_api, "g-1") == "Available", timeout=10)
        nodes = {fake_api.get("reservations", f"g-{i}")["status"]["nodeName"] for i in range(2)}
        assert nodes == {"gpu-2", "gpu-3"}


async def test_a_bad_reservation_gets_a_condition_and_a_fixed_one_is_placed(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    seed_nodes(fake_api, ["gpu-1"])
    fake_api.put(reservation("bad", gpus=1, ttl="soon"))
    async with running_allocator(fake_api, pki):
        await until(lambda: scheduled(fake_api, "bad").get("reason") == "Invalid", timeout=10)
        assert "spec.ttl" in scheduled(fake_api, "bad")["message"]
        fixed = fake_api.get("reservations", "bad")
        fixed["spec"]["ttl"] = "1h"
        fake_api.put(fixed)
        await until(lambda: phase(fake_api, "bad") == "Available", timeout=10)


async def test_the_cpu_a_room_holds_is_kept_from_others(fake_api: FakeApiServer, pki: Pki) -> None:
    seed_nodes(fake_api, ["gpu-1"])  # 224 cpu
    fake_api.put(reservation("cpu", gpus=1, requests={"cpu": "200"}))
    async with running_allocator(fake_api, pki) as run:
        await until(lambda: phase(fake_api, "cpu") == "Available", timeout=10)
        hungry = fake_api.put(pod("hungry", gpus=1, requests={"cpu": "40"}))
        got = await run.client.filter(hungry, ["gpu-1"])
        assert got["NodeNames"] == [] and got["FailedNodes"] == {"gpu-1": "Insufficient cpu"}
        modest = fake_api.put(pod("modest", gpus=1, requests={"cpu": "20"}))
        assert (await run.client.filter(modest, ["gpu-1"]))["NodeNames"] == ["gpu-1"]


async def test_a_pod_that_must_use_a_reservation_waits_for_one(fake_api: FakeApiServer, pki: Pki) -> None:
    seed_nodes(fake_api, ["gpu-1"])
    async with running_allocator(fake_api, pki) as run:
        wants = fake_api.put(
            owner("wants", "later", 1, annotations={RESERVATION_AFFINITY: {"name": "later"}})
        )
        got = await run.client.filter(wants, ["gpu-1"])
        assert got["NodeNames"] == [] and "no reservation" in got["FailedNodes"]["gpu-1"]
        fake_api.put(reservation("later", gpus=1))
        await until(lambda: phase(fake_api, "later") == "Available", timeout=10)
        assert (await run.client.filter(wants, ["gpu-1"]))["NodeNames"] == ["gpu-1"]
