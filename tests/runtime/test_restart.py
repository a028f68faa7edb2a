"""The allocator process killed (SIGKILL) in the middle of a bind burst, then started again: every
allocation of a bound pod is rebuilt from the pods' annotations, nothing half-done counts, and
kube-scheduler's retries place the rest without giving any GPU twice."""

from __future__ import annotations

import asyncio
import json
import re
import signal

from tests.support.allocator_harness import (
    SchedulerClient,
    allocated,
    allocator_process,
    double_booked,
    pod,
    seed_nodes,
)
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Pki


async def schedule_pending(client: SchedulerClient, fake: FakeApiServer, nodes: list[str]) -> None:
    """kube-scheduler's retries: filter, then bind to the first node that fits. Bigger pods go
    first, so the free GPUs (exactly what the pending pods need) do not fragment."""
    for _ in range(10):
        pending = [p for p in fake.list_objects("pods", "default") if not p["spec"].get("nodeName")]
        pending.sort(
            key=lambda p: -int(p["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"])
        )
        if not pending:
            return
        for p in pending:
            passed = (await client.filter(p, nodes))["NodeNames"]
            if passed:
                await client.bind(p, passed[0])
    raise AssertionError("pods still pending after 10 rounds of retries")


async def test_killed_mid_burst_and_restarted_loses_and_duplicates_nothing(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    nodes = seed_nodes(fake_api, [f"gpu-{i}" for i in range(8)])
    # 40 pods for all 64 GPUs (2+1+2+1+2 per node): everything fits only if no GPU leaks.
    pods = [fake_api.put(pod(f"w-{i}", gpus=2 - (i // 8) % 2)) for i in range(40)]
    # Slow bindings keep binds in flight when the process dies.
    fake_api.inject_fault("POST", r"/binding$", delay=0.4, times=None)
    async with allocator_process(fake_api, pki) as first:
        await first.ready()
        client = SchedulerClient(f"https://127.0.0.1:{first.port}", pki, connections=40)
        first_wave = await asyncio.gather(*(client.bind(p, nodes[i % 8]) for i, p in enumerate(pods[:20])))
        assert first_wave == [""] * 20
        # A second wave: bindings still on their way when the process dies.
        second_wave = [
            asyncio.create_task(client.bind(p, nodes[(20 + i) % 8])) for i, p in enumerate(pods[20:])
        ]
        await asyncio.sleep(0.2)
        first.proc.send_signal(signal.SIGKILL)
        await first.proc.wait()
        results = await asyncio.gather(*second_wave, return_exceptions=True)
        await client.close()
    fake_api.clear_faults()
    # The binding carries the annotation, so a killed bind leaves none behind; an allocator that
    # wrote it before binding (older versions, other tools) could. Two such pods, annotated with
    # GPUs that bound pods use: they must count for nothing.
    current = {p["metadata"]["name"]: p for p in fake_api.list_objects("pods", "default")}
    used = [allocated(p) for p in current.values() if p["spec"].get("nodeName")]
    for p, stale in zip(
        [p for p in current.values() if not p["spec"].get("nodeName")][:2], used, strict=False
    ):
        p["metadata"].setdefault("annotations", {})["scheduling.koordinator.sh/device-allocated"] = stale
        fake_api.put(p)
    before = {p["metadata"]["name"]: p for p in fake_api.list_objects("pods", "default")}
    bound_before = {n: allocated(p) for n, p in before.items() if p["spec"].get("nodeName")}
    half_done = [n for n, p in before.items() if not p["spec"].get("nodeName") and allocated(p)]
    assert len(bound_before) >= 20  # the first wave, and any late binding of the second
    assert len(half_done) == min(2, 40 - len(bound_before))
    assert all(isinstance(r, BaseException) for r in results)  # the kill cut every second-wave bind off
    assert double_booked(before.values()) == []

    async with allocator_process(fake_api, pki) as second:
        await second.ready()
        # The restarted cache holds exactly what the bound pods' annotations say.
        expected: dict[str, int] = {}
        for p in before.values():
            if p["spec"].get("nodeName"):
                expected[p["spec"]["nodeName"]] = expected.get(p["spec"]["nodeName"], 0) + len(
                    json.loads(allocated(p))["gpu"]
                )
        gauges = await second.metric_lines("topoalloc_allocated_devices{")
        got = {re.search(r'node="([^"]+)"', g).group(1): int(float(g.split()[-1])) for g in gauges}  # type: ignore[union-attr]
        assert got == expected
        client = SchedulerClient(f"https://127.0.0.1:{second.port}", pki)
        try:
            await schedule_pending(client, fake_api, nodes)
        finally:
            await client.close()
    after = fake_api.list_objects("pods", "default")
    assert all(p["spec"].get("nodeName") for p in after)
    assert double_booked(after) == []
    assert sum(len(json.loads(allocated(p))["gpu"]) for p in after) == 64
    # Bound before the kill: untouched. Annotated but unbound at the kill: re-allocated afresh.
    assert {
        p["metadata"]["name"]: allocated(p) for p in after if p["metadata"]["name"] in bound_before
    } == bound_before
    print(f"\nbound before the kill: {len(bound_before)}, annotated but unbound: {len(half_done)}")
