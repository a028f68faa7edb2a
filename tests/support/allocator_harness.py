"""The allocator against the fake API server, shared by every test area: cluster objects to put in
it, a running allocator (the real `Allocator` on 127.0.0.1 with real mTLS, in process or as its own
`topoalloc allocator` process), a kube-scheduler-like client, and what the API server shows held."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp

from allocator.assembly import Allocator, build_allocator
from allocator.runtime.admission_settings import AdmissionSettings
from allocator.runtime.config import LeaderElection, ServiceConfig
from allocator.runtime.coreadapter import CoreAdapter
from allocator.runtime.kube import KubeApi
from apis import keys
from tests.support.fakeapi import FakeApiServer
from tests.support.machines import machine_device
from tests.support.pki import Pki

JSON = dict[str, Any]
GPU = "nvidia.com/gpu"
RDMA = "koordinator.sh/rdma"


# -- cluster objects --------------------------------------------------------------------------------


def node(name: str, *, gpus: int = 8, labels: dict[str, str] | None = None) -> JSON:
    allocatable = {"cpu": "224", "memory": "2015Gi", "pods": "250"}
    if gpus:
        allocatable[GPU] = str(gpus)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "status": {"capacity": dict(allocatable), "allocatable": allocatable},
    }


def device(name: str, kind: str = "dgx-h100") -> JSON:
    return machine_device(kind, name)


def seed_nodes(api: FakeApiServer, names: Iterable[str], kind: str = "dgx-h100") -> list[str]:
    out = []
    for name in names:
        api.put(node(name))
        api.put(device(name, kind))
        out.append(name)
    return out


def pod(
    name: str,
    *,
    gpus: int = 0,
    requests: dict[str, str] | None = None,
    annotations: dict[str, Any] | None = None,
    namespace: str = "default",
    node_name: str | None = None,
) -> JSON:
    res = dict(requests or {})
    if gpus:
        res[GPU] = str(gpus)
    res.setdefault("cpu", "1")
    res.setdefault("memory", "1Gi")
    meta: JSON = {"name": name, "namespace": namespace}
    if annotations:
        meta["annotations"] = {k: v if isinstance(v, str) else json.dumps(v) for k, v in annotations.items()}
    spec: JSON = {
        "containers": [
            {"name": "c", "image": "registry.invalid/cuda:12", "resources": {"requests": res, "limits": res}}
        ]
    }
    if node_name:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def allocated(p: JSON) -> str | None:
    return ((p.get("metadata") or {}).get("annotations") or {}).get(keys.DEVICE_ALLOCATED)


# -- the allocator and its client --------------------------------------------------------------------


def service_config(pki: Pki, **overrides: Any) -> ServiceConfig:
    le = overrides.pop("leader_election", LeaderElection(enabled=False))
    cfg = ServiceConfig(
        host="127.0.0.1",
        port=0,
        health_host="127.0.0.1",
        health_port=0,
        tls_cert=str(pki.server.cert),
        tls_key=str(pki.server.key),
        client_ca=str(pki.server.client_ca),
        tls_reload_interval=0.2,
        leader_election=le,
        backoff_initial=0.05,
        backoff_max=0.5,
        watch_timeout=30,
        event_window=1.0,
        admission=AdmissionSettings(host="127.0.0.1", port=0),
    )
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


class SchedulerClient:
    """Calls the extender the way kube-scheduler does: POST JSON over one kept-alive mTLS
    connection (a pool, for the concurrent tests)."""

    def __init__(self, url: str, pki: Pki, *, connections: int = 1) -> None:
        self.url = url
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=pki.client_context(), limit=connections),
            headers={"User-Agent": "Go-http-client/1.1", "Accept-Encoding": "gzip"},
        )

    async def close(self) -> None:
        await self.session.close()

    async def post(self, verb: str, body: bytes | str | Any) -> tuple[int, Any]:
        data = body if isinstance(body, bytes | str) else json.dumps(body, separators=(",", ":"))
        async with self.session.post(
            f"{self.url}/{verb}", data=data, headers={"Content-Type": "application/json"}
        ) as resp:
            text = await resp.text()
            if resp.status == 200:
                return resp.status, json.loads(text)
            return resp.status, text

    async def filter(self, p: JSON, names: list[str]) -> JSON:
        status, body = await self.post("filter", {"Pod": p, "Nodes": None, "NodeNames": names})
        assert status == 200, body
        return body

    async def prioritize(self, p: JSON, names: list[str]) -> dict[str, int]:
        status, body = await self.post("prioritize", {"Pod": p, "Nodes": None, "NodeNames": names})
        assert status == 200, body
        return {h["Host"]: h["Score"] for h in body}

    async def bind(self, p: JSON, node_name: str) -> str:
        meta = p["metadata"]
        args = {"PodName": meta["name"], "PodNamespace": meta.get("namespace", "default"),
                "PodUID": meta.get("uid", ""), "Node": node_name}  # fmt: skip
        status, body = await self.post("bind", args)
        assert status == 200, body
        return body["Error"]


class Running:
    def __init__(self, service: Allocator, client: SchedulerClient, api: KubeApi) -> None:
        self.service = service
        self.client = client
        self.api = api

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.service.health_port}"

    async def get(self, path: str) -> tuple[int, str]:
        async with aiohttp.ClientSession() as s, s.get(self.health_url + path) as r:
            return r.status, await r.text()

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        return self.service.metrics.registry.get_sample_value(name, labels or {})


@asynccontextmanager
async def running_allocator(
    fake: FakeApiServer, pki: Pki, *, connections: int = 1, wait: bool = True, **overrides: Any
) -> AsyncIterator[Running]:
    api = await KubeApi.connect(host=fake.url)
    service = build_allocator(service_config(pki, **overrides), api)
    await service.start()
    client = SchedulerClient(f"https://127.0.0.1:{service.port}", pki, connections=connections)
    try:
        if wait:
            await service.wait_synced(10)
        yield Running(service, client, api)
    finally:
        await client.close()
        await service.stop()
        await api.close()


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

    async def status(self, path: str) -> int:
        async with aiohttp.ClientSession() as s, s.get(self.health + path) as r:
            return r.status

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
async def allocator_process(
    fake: FakeApiServer, pki: Pki, *args: str, env: dict[str, str] | None = None
) -> AsyncIterator[Process]:
    """`topoalloc allocator` in its own process (so it can be SIGKILLed); without extra `args`
    it runs without leader election."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "topoalloc", "allocator", "-v",
        "--api-server", fake.url, "--no-events",
        "--host", "127.0.0.1", "--port", "0", "--health-host", "127.0.0.1", "--health-port", "0",
        "--webhook-host", "127.0.0.1", "--webhook-port", "0",
        "--tls-cert", str(pki.server.cert), "--tls-key", str(pki.server.key), "--client-ca", str(pki.server.client_ca),
        *(args or ("--no-leader-elect",)),
        stderr=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL, env={**os.environ, **(env or {})},
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


PERCENT_RESOURCES = (
    "koordinator.sh/gpu-core",
    "koordinator.sh/gpu-memory-ratio",
    RDMA,
    "koordinator.sh/fpga",
)


def double_booked(pods: Iterable[JSON]) -> list[str]:
    """Devices the API server shows over-allocated among bound, live pods: a percent resource of
    one device summing past 100, or one VF given to two pods."""
    shares: dict[tuple[str, str, int, str], list[tuple[str, int]]] = {}
    vfs: dict[tuple[str, str], str] = {}
    clashes = []
    for p in pods:
        text = allocated(p)
        node_name = (p.get("spec") or {}).get("nodeName")
        if not text or not node_name or (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        owner = f"{p['metadata']['namespace']}/{p['metadata']['name']}"
        for dtype, entries in json.loads(text).items():
            for entry in entries or []:
                for res, qty in (entry.get("resources") or {}).items():
                    if res in PERCENT_RESOURCES:
                        shares.setdefault((node_name, dtype, entry["minor"], res), []).append(
                            (owner, int(qty))
                        )
                for vf in (entry.get("extension") or {}).get("vfs", []):
                    where = (node_name, vf.get("busID"))
                    if where in vfs:
                        clashes.append(f"VF {where} held by {vfs[where]} and {owner}")
                    vfs[where] = owner
    for where, holders in shares.items():
        if sum(q for _, q in holders) > 100:
            clashes.append(f"{where} over-allocated: {holders}")
    return clashes


def api_holdings(pods: Iterable[JSON]) -> dict[str, tuple[str, str]]:
    """What the API server says is held: bound, live pods with a device-allocated annotation."""
    out = {}
    for p in pods:
        text = allocated(p)
        node_name = (p.get("spec") or {}).get("nodeName")
        if text and node_name and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            out[f"{p['metadata']['namespace']}/{p['metadata']['name']}"] = (node_name, text)
    return out


def node_view(core: CoreAdapter) -> dict[str, Any]:
    """What the core counts per node, in a comparable form."""
    out = {}
    for name, state in sorted(core.cluster.nodes.items()):
        out[name] = {
            "pods": sorted(state.pods),
            "used": {t: {m: dict(r) for m, r in per.items() if r} for t, per in state.used.items() if per},
            "vfs": {t: {m: sorted(v) for m, v in per.items() if v} for t, per in state.vf_taken.items()},
            "cpu": state.requested_cpu_milli,
            "memory": state.requested_memory,
        }
        out[name]["used"] = {t: per for t, per in out[name]["used"].items() if per}
        out[name]["vfs"] = {t: per for t, per in out[name]["vfs"].items() if per}
    return out


def rebuilt_from_api(fake: FakeApiServer) -> CoreAdapter:
    """Cluster state built from scratch from the API's current objects."""
    core = CoreAdapter()
    for n in fake.list_objects("nodes"):
        core.set_node(n)
    for d in fake.list_objects("devices"):
        core.set_device(d)
    nodes = {n["metadata"]["name"] for n in fake.list_objects("nodes")}
    for p in fake.list_objects("pods", "default"):
        usage = core.usage(p)
        if usage.node in nodes and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            core.assign_usage(usage.key, usage.node, usage)
    return core
