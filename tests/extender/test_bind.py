"""Bind's one write (the Binding carries the annotation) and its failure paths: every failure
rolls the reservation back and leaves the pod as it was; an unknown outcome keeps the
reservation until the watch or the TTL decides."""

from __future__ import annotations

import asyncio

from allocator.runtime.config import LeaderElection
from tests.support.allocator_harness import allocated, pod, running_allocator, seed_nodes
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Pki
from tests.support.polling import until

BINDING = r"/pods/[^/]+/binding$"


async def whole_node_free(run, node: str) -> bool:  # type: ignore[no-untyped-def]
    probe = pod("probe-8", gpus=8)
    return (await run.client.filter(probe, [node]))["NodeNames"] == [node]


async def test_failed_binding_rolls_back(fake_api: FakeApiServer, pki: Pki) -> None:
    seed_nodes(fake_api, ["gpu-1"])
    p = fake_api.put(pod("w", gpus=4))
    async with running_allocator(fake_api, pki) as run:
        fault = fake_api.inject_fault("POST", BINDING, status=409, message="conflict injected")
        error = await run.client.bind(p, "gpu-1")
        assert "conflict injected" in error and fault.hits == 1
        assert run.service.cache.ledger.holds == {}
        assert await whole_node_free(run, "gpu-1")
        stored = fake_api.get("pods", "w", "default")
        assert stored["spec"].get("nodeName") is None and allocated(stored) is None
        # kube-scheduler retries; this time it works.
        assert await run.client.bind(p, "gpu-1") == ""
        assert fake_api.get("pods", "w", "default")["spec"]["nodeName"] == "gpu-1"
        assert (
            run.metric("topoalloc_extender_failures_total", {"verb": "bind", "reason": "binding_failed"}) == 1
        )


async def test_one_write_binds_the_pod_with_its_devices(fake_api: FakeApiServer, pki: Pki) -> None:
    seed_nodes(fake_api, ["gpu-1"])
    p = fake_api.put(pod("w", gpus=8))
    async with running_allocator(fake_api, pki) as run:
        assert await run.client.bind(p, "gpu-1") == ""
        stored = fake_api.get("pods", "w", "default")
        assert stored["spec"]["nodeName"] == "gpu-1" and allocated(stored) is not None
        # No PATCH and no GET: the Binding carries the annotation, the cache had the pod.
        calls = [r for r in fake_api.requests(watch=False) if "/pods/w" in r.path]
        assert [(r.method, r.path.rsplit("/", 1)[-1]) for r in calls] == [("POST", "binding")]
        value = stored["metadata"]["annotations"]["scheduling.koordinator.sh/device-allocated"]
        assert calls[0].body["metadata"]["annotations"] == {
            "scheduling.koordinator.sh/device-allocated": value
        }


async def test_bind_past_the_deadline_is_undone_not_bound(fake_api: FakeApiServer, pki: Pki) -> None:
    seed_nodes(fake_api, ["gpu-1"])
    p = fake_api.put(pod("slow", gpus=2))
    async with running_allocator(fake_api, pki, bind_deadline=0.3) as run:
        # The cache lost the pod (watch lag): bind reads it from the API server, slowly.
        run.service.cache.pods.pop("default/slow")
        fake_api.inject_fault("GET", r"/pods/slow$", delay=0.5)  # then answers normally
        error = await run.client.bind(p, "gpu-1")
        assert error == "bind deadline exceeded"
        stored = fake_api.get("pods", "slow", "default")
        assert stored["spec"].get("nodeName") is None and allocated(stored) is None
        assert not [r for r in fake_api.requests(method="POST") if "binding" in r.path]
        assert run.service.cache.ledger.holds == {} and await whole_node_free(run, "gpu-1")


async def test_unknown_binding_outcome_keeps_the_reservation_until_its_ttl(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    seed_nodes(fake_api, ["gpu-1"])
    p = fake_api.put(pod("w", gpus=8))
    async with running_allocator(fake_api, pki, reservation_ttl=0.6) as run:
        fake_api.inject_fault("POST", BINDING, disconnect=True)
        error = await run.client.bind(p, "gpu-1")
        assert error.startswith("binding pod:")
        # The binding may have landed: the GPUs stay held...
        assert "default/w" in run.service.cache.ledger.holds
        assert not await whole_node_free(run, "gpu-1")
        # ...until the TTL says it never did.
        await until(lambda: not run.service.cache.ledger.holds, timeout=3)
        assert await whole_node_free(run, "gpu-1")
        assert run.metric("topoalloc_reservations_expired_total") == 1


async def test_retried_bind_after_a_late_success_is_a_success(fake_api: FakeApiServer, pki: Pki) -> None:
    seed_nodes(fake_api, ["gpu-1", "gpu-2"])
    p = fake_api.put(pod("w", gpus=1))
    async with running_allocator(fake_api, pki) as run:
        assert await run.client.bind(p, "gpu-1") == ""
        await until(lambda: run.service.cache.pod("default", "w").node == "gpu-1")
        assert await run.client.bind(p, "gpu-1") == ""  # wire fact 9: the scheduler retried
        assert "already bound to node gpu-1" in await run.client.bind(p, "gpu-2")


async def test_bind_checks_the_pod(fake_api: FakeApiServer, pki: Pki) -> None:
    seed_nodes(fake_api, ["gpu-1"])
    p = fake_api.put(pod("w", gpus=1))
    async with running_allocator(fake_api, pki) as run:
        assert "not found" in await run.client.bind(pod("ghost", gpus=1), "gpu-1")
        stale = {**p, "metadata": {**p["metadata"], "uid": "00000000-0000-0000-0000-000000000000"}}
        assert "has uid" in await run.client.bind(stale, "gpu-1")
        assert "not in the allocator's cache" in await run.client.bind(p, "gpu-99")
        assert fake_api.get("pods", "w", "default")["spec"].get("nodeName") is None


async def test_concurrent_binds_of_one_pod_bind_it_once(fake_api: FakeApiServer, pki: Pki) -> None:
    seed_nodes(fake_api, ["gpu-1", "gpu-2"])
    p = fake_api.put(pod("w", gpus=8))
    async with running_allocator(fake_api, pki, connections=2) as run:
        errors = await asyncio.gather(run.client.bind(p, "gpu-1"), run.client.bind(p, "gpu-2"))
        assert sorted(errors)[0] == "" and "in progress" in sorted(errors)[1]
        stored = fake_api.get("pods", "w", "default")
        await until(lambda: not run.service.cache.ledger.holds)
        free = [n for n in ("gpu-1", "gpu-2") if await whole_node_free(run, n)]
        assert free == [n for n in ("gpu-1", "gpu-2") if n != stored["spec"]["nodeName"]]


async def test_only_the_leader_binds(fake_api: FakeApiServer, pki: Pki) -> None:
    seed_nodes(fake_api, ["gpu-1"])
    p = fake_api.put(pod("w", gpus=1))
    fake_api.put({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "topoalloc-allocator", "namespace": "kube-system"},
        "spec": {"holderIdentity": "someone-else", "leaseDurationSeconds": 3600,
                 "renewTime": "2099-01-01T00:00:00.000000Z"},
    })  # fmt: skip
    le = LeaderElection(namespace="kube-system", identity="me", lease_duration=1, renew_deadline=0.5,
                        retry_period=0.1)  # fmt: skip
    async with running_allocator(fake_api, pki, leader_election=le) as run:
        assert "not the leader" in await run.client.bind(p, "gpu-1")
        # ...and closes kube-scheduler's kept-alive connection, so that its retry is routed anew
        # (the leader-only Service routes connections, not requests).
        args = {"PodName": "w", "PodNamespace": "default", "PodUID": p["metadata"]["uid"], "Node": "gpu-1"}
        async with run.client.session.post(f"{run.client.url}/bind", json=args) as resp:
            assert resp.status == 200 and resp.headers.get("Connection", "").lower() == "close"
        status, body = await run.get("/readyz")
        assert status == 503 and "someone-else" in body
        assert (await run.get("/syncz"))[0] == 200
        # filter still answers from the standby's cache
        assert (await run.client.filter(p, ["gpu-1"]))["NodeNames"] == ["gpu-1"]
