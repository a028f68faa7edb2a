"""The allocator process killed (SIGKILL) in the middle of a bind burst, then started again: every
allocation of a bound pod is rebuilt from the pods' annotations, nothing half-done counts, and
kube-scheduler's retries place the rest without giving any GPU twice."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp

from tests.service.harness import SchedulerClient, allocated, double_booked, pod, seed_nodes
from tests.service.pki import Pki
from tests.support.fakeapi import FakeApiServer

STARTED = re.compile(
    rb"extender on https://127\.0\.0\.1:(\d+), health and metrics on http://127\.0\.0\.1:(\d+)"
)


class Process:
    def __init__(
        self, proc: asyncio.subprocess.Process, port: int, health_port: int, log: list[bytes]
    ) -> None:
        self.proc = proc
        self.port = port
        self.health = f"http://127.0.0.1:{health_port}"
        self.log = log

    async def ready(self, timeout: float = 20.0) -> None:
        async with aiohttp.ClientSession() as s:
            for _ in range(int(timeout / 0.05)):
                async with s.get(self.health + "/readyz") as r:
                    if r.status == 200:
                        return
                await asyncio.sleep(0.05)
        raise AssertionError(b"".join(self.log[-30:]).decode(errors="replace"))

    async def metric_lines(self, prefix: str) -> list[str]:
        async with aiohttp.ClientSession() as s, s.get(self.health + "/metrics") as r:
            return [line for line in (await r.text()).splitlines() if line.startswith(prefix)]


@asynccontextmanager
async def allocator_process(fake: FakeApiServer, pki: Pki) -> AsyncIterator[Process]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "topoalloc", "allocator", "-v",
        "--api-server", fake.url, "--no-leader-elect", "--no-events",
        "--host", "127.0.0.1", "--port", "0", "--health-host", "127.0.0.1", "--health-port", "0",
        "--tls-cert", str(pki.server.cert), "--tls-key", str(pki.server.key), "--client-ca", str(pki.server.client_ca),
        stderr=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    log: list[bytes] = []
    assert proc.stderr is not None
    match = None
    while match is None:
        line = await asyncio.wait_for(proc.stderr.readline(), 30)
        assert line, b"".join(log).decode(errors="replace")
        log.append(line)
        match = STARTED.search(line)

    async def drain() -> None:
        assert proc.stderr is not None
        while line := await proc.stderr.readline():
            log.append(line)

    drainer = asyncio.create_task(drain())
    try:
        yield Process(proc, int(match.group(1)), int(match.group(2)), log)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 15)
        await drainer


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
    # Slow bindings keep binds in flight between the annotation patch and the binding.
    fake_api.inject_fault("POST", r"/binding$", delay=0.4, times=None)
    async with allocator_process(fake_api, pki) as first:
        await first.ready()
        client = SchedulerClient(f"https://127.0.0.1:{first.port}", pki, connections=40)
        first_wave = await asyncio.gather(*(client.bind(p, nodes[i % 8]) for i, p in enumerate(pods[:20])))
        assert first_wave == [""] * 20
        # A second wave: annotations written, bindings still on their way when the process dies.
        second_wave = [
            asyncio.create_task(client.bind(p, nodes[(20 + i) % 8])) for i, p in enumerate(pods[20:])
        ]
        await asyncio.sleep(0.2)
        first.proc.send_signal(signal.SIGKILL)
        await first.proc.wait()
        results = await asyncio.gather(*second_wave, return_exceptions=True)
        await client.close()
    fake_api.clear_faults()
    before = {p["metadata"]["name"]: p for p in fake_api.list_objects("pods", "default")}
    bound_before = {n: allocated(p) for n, p in before.items() if p["spec"].get("nodeName")}
    half_done = [n for n, p in before.items() if not p["spec"].get("nodeName") and allocated(p)]
    assert len(bound_before) >= 20  # the first wave, and any late binding of the second
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
