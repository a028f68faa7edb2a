"""Pods whose amounts Kubernetes would refuse (issue 18) get the same clear reason from the
extender as from `topoalloc allocate`: every offered node, unresolvable, and one pod Event; never
a 5xx and never a rounded or capped allocation."""

from __future__ import annotations

import pytest

from tests.support.allocator_harness import allocated, pod, running_allocator, seed_nodes
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Pki


@pytest.mark.parametrize(
    ("amount", "words"),
    [
        ("1.5", "must be a whole number: nvidia.com/gpu is an extended resource"),
        ("-1", "must not be negative"),
        ("1e21", "too large"),
    ],
)
async def test_bad_gpu_amount_is_a_reason_and_an_event(
    fake_api: FakeApiServer, pki: Pki, amount: str, words: str
) -> None:
    names = seed_nodes(fake_api, ["gpu-1", "gpu-2"])
    bad = fake_api.put(pod("odd", requests={"nvidia.com/gpu": amount}))
    async with running_allocator(fake_api, pki) as run:
        status, body = await run.client.post("filter", {"Pod": bad, "NodeNames": names})
        assert status == 200, body
        assert body["NodeNames"] == [] and body["FailedNodes"] == {}
        reasons = body["FailedAndUnresolvableNodes"]
        assert set(reasons) == set(names)
        assert all("nvidia.com/gpu" in r and words in r for r in reasons.values()), reasons
        await run.service.events.drain()
        events = (await run.api.raw("GET", "/apis/events.k8s.io/v1/namespaces/default/events"))["items"]
        assert len(events) == 1 and events[0]["regarding"]["name"] == "odd"
        assert words in events[0]["note"]
        error = await run.client.bind(bad, "gpu-1")
        assert words in error
        stored = fake_api.get("pods", "odd", "default")
        assert stored["spec"].get("nodeName") is None and allocated(stored) is None


async def test_deep_nesting_is_a_400_or_a_reason_never_a_500(fake_api: FakeApiServer, pki: Pki) -> None:
    # Found by bench/fuzz.py: `json` recursed past Python's limit (orjson stops at 1024 levels and
    # hands over to it), so such a body or annotation was a 500.
    names = seed_nodes(fake_api, ["gpu-1"])
    deep = fake_api.put(
        pod("deep", gpus=1, annotations={"scheduling.koordinator.sh/device-allocate-hint": "[" * 5000})
    )
    async with running_allocator(fake_api, pki) as run:
        status, text = await run.client.post("filter", b"[" * 100_000)
        assert status == 400 and "nested too deeply" in text
        status, body = await run.client.post("filter", {"Pod": deep, "NodeNames": names})
        assert status == 200, body
        assert "nested too deeply" in body["FailedAndUnresolvableNodes"]["gpu-1"]


async def test_odd_pod_metadata_is_never_a_500(fake_api: FakeApiServer, pki: Pki) -> None:
    # Found by bench/fuzz.py (1 in 100,000 calls): the quantity "1E" (1 exa) crashed the
    # quantity parser, and the filter answered 500.
    names = seed_nodes(fake_api, ["gpu-1", "gpu-2"])
    body = {
        "Pod": {
            "apiVersion": "v1",
            "kind": [],
            "metadata": {"name": "odd", "namespace": "default", "uid": {"deviceTypes": {}},
                         "annotations": {"scheduling.koordinator.sh/device-joint-allocate": '{"deviceTypes":["gpu","rdm'}},
            "spec": {"containers": [{"name": "c", "image": "x", "resources": {"requests": {}}}],
                     "overhead": {"x" * 300: "1E"}},
        },
        "Nodes": None,
        "NodeNames": names,
    }  # fmt: skip
    async with running_allocator(fake_api, pki) as run:
        status, reply = await run.client.post("filter", body)
        assert status == 200, reply
        # No device requested: every node passes (an overhead of 1E, exa, of an odd resource is
        # kube-scheduler's business).
        assert reply["NodeNames"] == names


async def test_a_lone_surrogate_in_a_bind_is_decoded_as_go_does(fake_api: FakeApiServer, pki: Pki) -> None:
    # Found by bench/fuzz.py: a pod name holding an escaped lone surrogate made bind answer 500
    # (the name could not be encoded into the pod's URL). Go's decoder reads it as U+FFFD.
    seed_nodes(fake_api, ["gpu-1"])
    body = b'{"PodName": "\\ud800", "PodNamespace": "default", "PodUID": "u", "Node": "gpu-1"}'
    async with running_allocator(fake_api, pki) as run:
        status, reply = await run.client.post("bind", body)
        assert status == 200, reply
        assert reply["Error"] and "\ufffd" in reply["Error"]
