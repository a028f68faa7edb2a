"""What a pod says that topoalloc would ignore: the extender tells it once per pod as a Warning Event
(`IgnoredPodSettings`) and places the pod as before; an unknown device type in the joint-allocate
annotation is refused like a misspelt scope, as a reason on every node and a pod Event."""

from __future__ import annotations

from typing import Any

from tests.support.allocator_harness import RDMA, pod, running_allocator, seed_nodes
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Pki

EVENTS = "/apis/events.k8s.io/v1/namespaces/default/events"
TYPO = "scheduling.koordinator.sh/device-joint-alocate"


async def _events(run: Any) -> list[dict[str, Any]]:
    await run.service.events.drain()
    return (await run.api.raw("GET", EVENTS))["items"]


async def test_a_misspelt_annotation_is_one_warning_event_and_changes_nothing(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    names = seed_nodes(fake_api, ["gpu-1", "gpu-2"])
    joint = {"deviceTypes": ["gpu", "rdma"], "requiredScope": "SamePCIe"}
    odd = fake_api.put(
        pod("odd", gpus=1, requests={RDMA: "1", "nvida.com/gpu": "1"}, annotations={TYPO: joint})
    )
    async with running_allocator(fake_api, pki) as run:
        for _ in range(3):  # kube-scheduler retries: still one Event
            status, body = await run.client.post("filter", {"Pod": odd, "NodeNames": names})
            assert status == 200 and body["NodeNames"], body  # placed as before (the best node)
        events = [e for e in await _events(run) if e["reason"] == "IgnoredPodSettings"]
        assert len(events) == 1 and events[0]["type"] == "Warning" and events[0].get("series") is None
        note = events[0]["note"]
        assert (
            f"unknown annotation {TYPO} (did you mean scheduling.koordinator.sh/device-joint-allocate?)"
            in note
        )
        assert "unknown resource nvida.com/gpu (did you mean nvidia.com/gpu?)" in note


async def test_an_unknown_device_type_to_allocate_jointly_is_refused_with_the_reason(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    names = seed_nodes(fake_api, ["gpu-1", "gpu-2"])
    joint = {"deviceTypes": ["gpu", "nic"]}
    bad = fake_api.put(
        pod(
            "nic",
            gpus=1,
            requests={RDMA: "1"},
            annotations={"scheduling.koordinator.sh/device-joint-allocate": joint},
        )
    )
    async with running_allocator(fake_api, pki) as run:
        status, body = await run.client.post("filter", {"Pod": bad, "NodeNames": names})
        assert status == 200 and body["NodeNames"] == []
        reasons = body["FailedAndUnresolvableNodes"]
        assert set(reasons) == set(names)
        assert all(
            "deviceTypes[1]: must be one of gpu, rdma, fpga (got 'nic')" in r for r in reasons.values()
        )
        [event] = await _events(run)
        assert event["reason"] == "FailedDeviceAllocation" and "(got 'nic')" in event["note"]
