"""Health, readiness and metrics on the plain-HTTP port."""

from __future__ import annotations

from tests.support.allocator_harness import allocated, pod, running_allocator, seed_nodes
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Pki
from tests.support.polling import until


async def test_not_ready_until_every_kind_has_synced(fake_api: FakeApiServer, pki: Pki) -> None:
    seed_nodes(fake_api, ["gpu-1"])
    p = fake_api.put(pod("w", gpus=1))
    # Pods cannot be listed yet: the cache must not answer from a partial view.
    fault = fake_api.inject_fault("GET", r"^/api/v1/pods$", watch=False, status=500, times=None)
    async with running_allocator(fake_api, pki, wait=False) as run:
        await until(lambda: fault.hits >= 2)
        status, body = await run.get("/readyz")
        assert status == 503 and "Pod cache not synced" in body
        assert (await run.get("/syncz"))[0] == 503
        assert (await run.get("/healthz"))[0] == 200  # alive, just not ready
        assert (await run.client.filter(p, ["gpu-1"]))["Error"] == "allocator cache is not synced yet"
        assert await run.client.bind(p, "gpu-1") == "allocator cache is not synced yet"
        assert (await run.client.post("prioritize", {"Pod": p, "NodeNames": ["gpu-1"]}))[0] == 503
        fake_api.clear_faults()
        await run.service.wait_synced(5)
        assert (await run.get("/readyz")) == (200, "ok\n")
        assert run.metric("topoalloc_cache_synced", {"kind": "Pod"}) == 1


async def test_metrics_cover_requests_cache_leader_and_allocations(fake_api: FakeApiServer, pki: Pki) -> None:
    seed_nodes(fake_api, ["gpu-1", "gpu-2"])
    p = fake_api.put(pod("w", gpus=2))
    async with running_allocator(fake_api, pki) as run:
        await run.client.filter(p, ["gpu-1", "gpu-2"])
        await run.client.prioritize(p, ["gpu-1", "gpu-2"])
        assert await run.client.bind(p, "gpu-2") == ""
        await until(lambda: allocated(fake_api.get("pods", "w", "default")) is not None)
        await until(lambda: not run.service.cache.ledger.holds)
        status, text = await run.get("/metrics")
        assert status == 200
        for line in (
            'topoalloc_extender_requests_total{result="ok",verb="filter"} 1.0',
            'topoalloc_extender_requests_total{result="ok",verb="prioritize"} 1.0',
            'topoalloc_extender_requests_total{result="ok",verb="bind"} 1.0',
            'topoalloc_extender_request_duration_seconds_count{verb="filter"} 1.0',
            'topoalloc_cache_synced{kind="Device"} 1.0',
            "topoalloc_leader 1.0",
            'topoalloc_allocated_devices{node="gpu-2",type="gpu"} 2.0',
            "topoalloc_reservations 0.0",
        ):
            assert line in text, line
        gauges = [line for line in text.splitlines() if line.startswith("topoalloc_allocated_devices{")]
        assert gauges == ['topoalloc_allocated_devices{node="gpu-2",type="gpu"} 2.0']
