"""Reservations end to end on the fake API server: the real allocator places a Reservation, owners
are steered to and bound on its devices, everyone else sees them taken."""

from __future__ import annotations

import json

from apis import keys
from apis.reservation_pod import RESERVATION_ALLOCATED, RESERVATION_IGNORED
from tests.reservations.objects import reservation
from tests.support.allocator_harness import allocated, pod, running_allocator, seed_nodes
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Pki
from tests.support.polling import until

RDMA = "koordinator.sh/rdma"


def _available(fake: FakeApiServer, name: str) -> bool:
    got = fake.get("reservations", name)
    return (got.get("status") or {}).get("phase") == "Available"


def _minors(annotation: str, dtype: str) -> list[int]:
    return sorted(a["minor"] for a in json.loads(annotation).get(dtype) or [])


async def test_a_reservation_is_placed_and_its_owner_takes_exactly_its_devices(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    names = seed_nodes(fake_api, ["gpu-1", "gpu-2"])
    fake_api.put(reservation("train", gpus=2, requests={RDMA: "2"}, template_annotations={
        keys.DEVICE_JOINT_ALLOCATE: {"deviceTypes": ["gpu", "rdma"], "requiredScope": "SamePCIe"}}))  # fmt: skip
    async with running_allocator(fake_api, pki) as run:
        await until(lambda: _available(fake_api, "train"), timeout=10)
        res = fake_api.get("reservations", "train")
        node = res["status"]["nodeName"]
        reserved = res["metadata"]["annotations"][keys.DEVICE_ALLOCATED]
        assert len(_minors(reserved, "gpu")) == 2 and len(_minors(reserved, "rdma")) == 2

        owner = pod("owner", gpus=2, requests={RDMA: "2"}, annotations={
            keys.DEVICE_JOINT_ALLOCATE: {"deviceTypes": ["gpu", "rdma"], "requiredScope": "SamePCIe"}})  # fmt: skip
        owner["metadata"]["labels"] = {"app": "train"}
        owner = fake_api.put(owner)
        got = await run.client.filter(owner, names)
        assert got["NodeNames"] == [node]
        assert await run.client.bind(owner, node) == ""
        stored = fake_api.get("pods", "owner", "default")
        assert _minors(allocated(stored), "gpu") == _minors(reserved, "gpu")
        assert _minors(allocated(stored), "rdma") == _minors(reserved, "rdma")
        assert json.loads(stored["metadata"]["annotations"][RESERVATION_ALLOCATED])["name"] == "train"
        # allocateOnce: the room is used up and the Reservation succeeds.
        await until(
            lambda: fake_api.get("reservations", "train")["status"]["phase"] == "Succeeded", timeout=10
        )


async def test_a_non_owner_cannot_take_reserved_gpus_but_an_ignored_pod_can(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    seed_nodes(fake_api, ["gpu-1"])
    fake_api.put(reservation("room", gpus=4))
    async with running_allocator(fake_api, pki) as run:
        await until(lambda: _available(fake_api, "room"), timeout=10)
        other = fake_api.put(pod("other", gpus=8))
        got = await run.client.filter(other, ["gpu-1"])
        assert got["NodeNames"] == [] and "gpu-1" in got["FailedNodes"]
        half = fake_api.put(pod("half", gpus=4))
        assert (await run.client.filter(half, ["gpu-1"]))["NodeNames"] == ["gpu-1"]
        ignored = pod("ignored", gpus=8)
        ignored["metadata"]["labels"] = {RESERVATION_IGNORED: "true"}
        ignored = fake_api.put(ignored)
        got = await run.client.filter(ignored, ["gpu-1"])
        assert got["NodeNames"] == ["gpu-1"]
        assert await run.client.bind(ignored, "gpu-1") == ""
