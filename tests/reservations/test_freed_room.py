"""Room a Reservation gives back goes at once to the pods kube-scheduler holds as unschedulable:
the real allocator against the fake API server. A pod that now fits the freed node is nudged (an
annotation write, which moves it out of kube-scheduler's unschedulable queue); one that does not fit,
one kube-scheduler has not found unschedulable, and one bound meanwhile are left alone. The
real-control-plane scenario (the pod then bound within seconds) is tests/cluster/test_freed_room.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from apis import keys
from apis.annotations import DeviceAllocations
from apis.reservation_pod import RESERVATION_ALLOCATED
from tests.reservations.objects import reservation
from tests.support.allocations import entry
from tests.support.allocator_harness import Running, pod, running_allocator, seed_nodes
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Pki
from tests.support.polling import until

GPU = {
    "koordinator.sh/gpu-core": 100,
    "koordinator.sh/gpu-memory": 81559 * 2**20,
    "koordinator.sh/gpu-memory-ratio": 100,
}
UNSCHEDULABLE = {
    "type": "PodScheduled",
    "status": "False",
    "reason": "Unschedulable",
    "message": "0/1 nodes are available: 1 topoalloc: not enough free GPUs.",
}


def busy(name: str, node: str, minors: list[int]) -> dict[str, Any]:
    """A pod bound on `minors` of `node`."""
    p = pod(name, gpus=len(minors), node_name=node)
    p["metadata"]["annotations"] = {
        keys.DEVICE_ALLOCATED: DeviceAllocations({"gpu": [entry(m, GPU) for m in minors]}).to_json()
    }
    return p


def held_back(
    name: str, gpus: int, *, scheduled: dict[str, Any] | None = UNSCHEDULABLE, app: str = ""
) -> Any:
    """A pending pod as kube-scheduler leaves it after a failed attempt."""
    p = pod(name, gpus=gpus)
    if app:
        p["metadata"]["labels"] = {"app": app}
    if scheduled is not None:
        p["status"] = {"phase": "Pending", "conditions": [scheduled]}
    return p


def nudged(fake: FakeApiServer, name: str) -> str:
    got = fake.get("pods", name, "default") or {}
    return str(((got.get("metadata") or {}).get("annotations") or {}).get(keys.NUDGED) or "")


def phase(fake: FakeApiServer, name: str) -> str:
    return str(((fake.get("reservations", name) or {}).get("status") or {}).get("phase") or "")


async def passed(run: Running) -> None:
    """The Reservation controller's next two passes completed (the second after any nudge the
    first woke), so what was not nudged by then is not going to be."""
    await run.service.component("reservations").runner.wait_passes(2)  # type: ignore[attr-defined]


@pytest.mark.parametrize("how", ["expires", "deleted"])
async def test_freed_room_nudges_exactly_the_held_back_pods_that_fit_it(
    fake_api: FakeApiServer, pki: Pki, how: str
) -> None:
    seed_nodes(fake_api, ["gpu-1"])
    fake_api.put(busy("filler", "gpu-1", [2, 3, 4, 5, 6, 7]))
    fake_api.put(reservation("brief", gpus=2, ttl="3s" if how == "expires" else "1h"))
    async with running_allocator(fake_api, pki) as run:
        await until(lambda: phase(fake_api, "brief") == "Available", timeout=10)
        fake_api.put(held_back("fits", 2))
        fake_api.put(held_back("too-big", 4))
        fake_api.put(held_back("never-tried", 2, scheduled=None))
        await passed(run)
        assert not any(nudged(fake_api, n) for n in ("fits", "too-big", "never-tried"))
        if how == "deleted":
            fake_api.remove("reservations", "brief")
        else:
            await until(lambda: phase(fake_api, "brief") == "Failed", timeout=15)
        await until(lambda: nudged(fake_api, "fits"), timeout=10)
        assert nudged(fake_api, "fits").startswith("room freed on gpu-1 at ")
        await passed(run)
        assert not nudged(fake_api, "too-big") and not nudged(fake_api, "never-tried")


async def test_an_owners_share_back_in_its_room_nudges_the_owner_waiting_for_it(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    """A shared room (allocateOnce false) of 2 GPUs with one owner on both: a second owner waits.
    The first owner leaves: its GPUs are the room's again, and the second owner is nudged."""
    seed_nodes(fake_api, ["gpu-1"])
    fake_api.put(busy("filler", "gpu-1", [2, 3, 4, 5, 6, 7]))
    fake_api.put(reservation("shared", gpus=2, allocateOnce=False))
    async with running_allocator(fake_api, pki) as run:
        await until(lambda: phase(fake_api, "shared") == "Available", timeout=10)
        first = pod("first", gpus=2)
        first["metadata"]["labels"] = {"app": "shared"}
        first = fake_api.put(first)
        assert await run.client.bind(first, "gpu-1") == ""
        stored = fake_api.get("pods", "first", "default") or {}
        assert json.loads(stored["metadata"]["annotations"][RESERVATION_ALLOCATED])["name"] == "shared"
        fake_api.put(held_back("second", 2, app="shared"))
        fake_api.put(held_back("stranger", 2))
        await passed(run)
        assert not nudged(fake_api, "second")
        fake_api.remove("pods", "first", "default")
        await until(lambda: nudged(fake_api, "second"), timeout=10)
        await passed(run)
        assert not nudged(fake_api, "stranger")  # the room's GPUs are its owners' only
