"""End-to-end support for gang tests: the fake API server, the real allocator (extender, webhook,
gang controller) and a stand-in for kube-scheduler and kube-apiserver's admission chain, all
talking HTTP on 127.0.0.1.

`KubeScheduler` does kube-scheduler's part over HTTP: it LISTs and WATCHes pods on the API server,
skips pods that are gated, bound, deleting or held back by the test, and schedules the rest one
at a time like kube-scheduler's loop: filter with every node name (nodeCacheCapable), prioritize
when more than one node passed, the best-scored node (first among equals), then bind, with binds
running concurrently. A pod that fails waits for any pod change (kube-scheduler's queueing hints
move unschedulable pods back on cluster events) or a short backoff. It leaves out
kube-scheduler's own plugins: the extender alone decides here.

`Admission` does the API server's part for creations: it POSTs an AdmissionReview to the
allocator's webhook over TLS (verifying the allocator's certificate, presenting none) and applies
the JSON patch it answers with before creating the pod.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import ssl
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import jsonpatch

from allocator.assembly import Allocator
from allocator.runtime.gang_settings import GangSettings
from apis import keys
from apis import resources as rn
from apis.annotations import DeviceAllocations
from tests.support.allocations import entry
from tests.support.allocator_harness import GPU, Running, SchedulerClient, running_allocator
from tests.support.fakeapi import FakeApiServer
from tests.support.machines import machine_device
from tests.support.pki import Pki

JSON = dict[str, Any]
PG_PATH = "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups"
RACK = "topoalloc.io/rack"
FAST = {"resync_period": 1.0, "batch_delay": 0.02}


# -- objects ----------------------------------------------------------------------------------------


def gpu_node(
    api: FakeApiServer, name: str, labels: dict[str, str] | None = None, kind: str = "dgx-h100"
) -> None:
    allocatable = {"cpu": "64", "memory": "512Gi", "pods": "110", GPU: "8"}
    api.put(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "status": {"capacity": dict(allocatable), "allocatable": allocatable},
        }
    )
    api.put(machine_device(kind, name))


def member(
    name: str,
    *,
    group: str = "",
    gpus: int = 1,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    gated: bool = False,
    priority: int | None = None,
) -> JSON:
    """A pod asking for whole GPUs, in PodGroup `group` (label) when given, with `spec.priority`
    (what the API server's Priority admission fills in) when given."""
    meta: JSON = {"name": name, "namespace": "default", "labels": dict(labels or {})}
    if group:
        meta["labels"][keys.POD_GROUP_LABEL] = group
    if annotations:
        meta["annotations"] = dict(annotations)
    res = {"cpu": "1", "memory": "1Gi"}
    if gpus:
        res[GPU] = str(gpus)
    spec: JSON = {
        "containers": [
            {"name": "c", "image": "registry.invalid/cuda:12", "resources": {"requests": res, "limits": res}}
        ]
    }
    if gated:
        spec["schedulingGates"] = [{"name": keys.GANG_SCHEDULING_GATE}]
    if priority is not None:
        spec["priority"] = priority
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def podgroup(name: str, min_member: int, timeout: int | None = None) -> JSON:
    spec: JSON = {"minMember": min_member}
    if timeout is not None:
        spec["scheduleTimeoutSeconds"] = timeout
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }


def node_of(pod: JSON) -> str:
    return (pod.get("spec") or {}).get("nodeName") or ""


def gates_of(pod: JSON) -> list[str]:
    return [g["name"] for g in (pod.get("spec") or {}).get("schedulingGates") or []]


# -- kube-apiserver's side ----------------------------------------------------------------------------


class Admission:
    """Creates objects over HTTP, pods through the allocator's mutating webhook first."""

    def __init__(self, api_url: str, webhook_url: str, pki: Pki) -> None:
        self.api_url = api_url
        self.webhook_url = webhook_url
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(pki.dir / "ca.crt"))
        self.hook = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx))
        self.plain = aiohttp.ClientSession()
        self.reviews = 0

    async def close(self) -> None:
        await self.hook.close()
        await self.plain.close()

    async def review(self, pod: JSON) -> JSON:
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": str(uuid.uuid4()),
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": pod["metadata"].get("namespace", "default"),
                "operation": "CREATE",
                "object": pod,
            },
        }
        async with self.hook.post(self.webhook_url, json=review) as resp:
            assert resp.status == 200, await resp.text()
            answer = (await resp.json())["response"]
        self.reviews += 1
        assert answer["uid"] == review["request"]["uid"]
        return answer

    async def create_pod(self, pod: JSON) -> JSON:
        answer = await self.review(pod)
        assert answer["allowed"], answer
        if answer.get("patch"):
            assert answer["patchType"] == "JSONPatch"
            ops = json.loads(base64.b64decode(answer["patch"]))
            pod = jsonpatch.apply_patch(pod, ops)
        return await self.create(
            f"/api/v1/namespaces/{pod['metadata'].get('namespace', 'default')}/pods", pod
        )

    async def create(self, path: str, obj: JSON) -> JSON:
        async with self.plain.post(self.api_url + path, json=obj) as resp:
            body = await resp.json()
            assert resp.status == 201, body
            return body

    async def create_podgroup(self, pg: JSON) -> JSON:
        return await self.create(PG_PATH.format(ns=pg["metadata"]["namespace"]), pg)

    async def delete_pod(self, name: str, namespace: str = "default") -> None:
        url = f"{self.api_url}/api/v1/namespaces/{namespace}/pods/{name}"
        async with self.plain.delete(url, json={"gracePeriodSeconds": 0}) as resp:
            assert resp.status in (200, 404), await resp.text()


# -- kube-scheduler's side ----------------------------------------------------------------------------


@dataclass
class KubeScheduler:
    api_url: str
    client: SchedulerClient
    hold: set[str] = field(default_factory=set)  # pod names the test keeps it from scheduling
    backoff: float = 0.3
    pods: dict[str, JSON] = field(default_factory=dict)
    attempts: Counter[str] = field(default_factory=Counter)
    filtered_out: dict[str, dict[str, str]] = field(default_factory=dict)  # last reasons per pod
    bind_errors: dict[str, str] = field(default_factory=dict)
    binds: list[tuple[str, str]] = field(default_factory=list)  # (pod, node) bound through the extender

    def __post_init__(self) -> None:
        self._session = aiohttp.ClientSession()
        self._changed = asyncio.Event()
        self._busy: set[str] = set()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        synced = asyncio.Event()
        self._tasks = [asyncio.create_task(self._watch(synced)), asyncio.create_task(self._loop())]
        await asyncio.wait_for(synced.wait(), 10)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._session.close()

    def release(self, *names: str) -> None:
        self.hold.difference_update(names)
        self._changed.set()

    async def _watch(self, synced: asyncio.Event) -> None:
        while True:
            try:
                async with self._session.get(f"{self.api_url}/api/v1/pods") as resp:
                    listed = await resp.json()
                self.pods = {_key(p): p for p in listed["items"]}
                synced.set()
                self._changed.set()
                rv = listed["metadata"]["resourceVersion"]
                url = f"{self.api_url}/api/v1/pods?watch=1&resourceVersion={rv}&timeoutSeconds=60"
                async with self._session.get(url, timeout=aiohttp.ClientTimeout(total=None)) as resp:
                    async for line in resp.content:
                        if not line.strip():
                            continue
                        event = json.loads(line)
                        obj = event["object"]
                        if event["type"] == "DELETED":
                            self.pods.pop(_key(obj), None)
                        elif event["type"] in ("ADDED", "MODIFIED"):
                            self.pods[_key(obj)] = obj
                        self._changed.set()
            except (aiohttp.ClientError, ValueError, KeyError):
                await asyncio.sleep(0.1)

    def _ready(self) -> list[JSON]:
        out = []
        for key, pod in sorted(self.pods.items()):
            meta, spec = pod["metadata"], pod.get("spec") or {}
            if (
                key in self._busy
                or meta["name"] in self.hold
                or spec.get("nodeName")
                or spec.get("schedulingGates")
                or meta.get("deletionTimestamp")
            ):
                continue
            out.append(pod)
        return out

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.backoff):
                    await self._changed.wait()
            self._changed.clear()
            for pod in self._ready():
                await self._schedule_one(pod)

    async def _schedule_one(self, pod: JSON) -> None:
        key = _key(pod)
        self.attempts[key] += 1
        async with self._session.get(f"{self.api_url}/api/v1/nodes") as resp:
            names = [n["metadata"]["name"] for n in (await resp.json())["items"]]
        result = await self.client.filter(pod, names)
        passed = result.get("NodeNames") or []
        if result.get("Error") or not passed:
            self.filtered_out[key] = {**result["FailedNodes"], **result["FailedAndUnresolvableNodes"]}
            return
        best = passed[0]
        if len(passed) > 1:
            scores = await self.client.prioritize(pod, passed)
            best = max(passed, key=lambda n: scores.get(n, 0))  # first among equals
        self._busy.add(key)
        self._tasks.append(asyncio.create_task(self._bind(key, pod, best)))

    async def _bind(self, key: str, pod: JSON, node: str) -> None:
        try:
            error = await self.client.bind(pod, node)
            if error:
                self.bind_errors[key] = error
            else:
                self.binds.append((key, node))
        finally:
            self._busy.discard(key)
            self._changed.set()


def _key(pod: JSON) -> str:
    meta = pod["metadata"]
    return f"{meta.get('namespace', 'default')}/{meta['name']}"


# -- the whole set-up ------------------------------------------------------------------------------------


@dataclass
class GangWorld:
    fake: FakeApiServer
    running: Running
    admission: Admission
    scheduler: KubeScheduler

    @property
    def service(self) -> Allocator:
        return self.running.service

    def pods(self) -> dict[str, JSON]:
        return {p["metadata"]["name"]: p for p in self.fake.list_objects("pods", "default")}

    def podgroup_status(self, name: str) -> JSON:
        obj = self.fake.get("podgroups", name, "default")
        assert obj is not None
        return obj.get("status") or {}

    def events_about(self, name: str, kind: str = "Pod") -> list[JSON]:
        out = []
        for e in self.fake.list_objects("events", "default"):
            regarding = e.get("involvedObject") or e.get("regarding") or {}
            if regarding.get("name") == name and regarding.get("kind") == kind:
                out.append(e)
        return out

    def notes_about(self, name: str, kind: str = "Pod") -> list[str]:
        return [e.get("note") or e.get("message") or "" for e in self.events_about(name, kind)]

    def gang_reservations(self) -> dict[str, str]:
        return {k: r.node for k, r in self.service.cache.ledger.holds.items() if r.holder}


def gang_settings(**overrides: Any) -> GangSettings:
    settings = GangSettings(topology_keys=[RACK], **FAST)
    for key, value in overrides.items():
        setattr(settings, key, value)
    return settings


@asynccontextmanager
async def gang_world(
    fake: FakeApiServer, pki: Pki, *, hold: set[str] | None = None, round_trips: int = 1, **gang: Any
) -> AsyncIterator[GangWorld]:
    async with (
        running_allocator(fake, pki, gang=gang_settings(**gang), round_trips=round_trips) as running,
        allocator_front(fake, pki, running, hold=hold) as world,
    ):
        yield world


@asynccontextmanager
async def allocator_front(
    fake: FakeApiServer, pki: Pki, running: Running, *, hold: set[str] | None = None
) -> AsyncIterator[GangWorld]:
    """Admission and a kube-scheduler in front of an allocator that is already running."""
    webhook = f"https://127.0.0.1:{running.service.webhook_port}/mutate-pods"
    admission = Admission(fake.url, webhook, pki)
    scheduler = KubeScheduler(fake.url, running.client, hold=set(hold or ()))
    await scheduler.start()
    try:
        yield GangWorld(fake, running, admission, scheduler)
    finally:
        await scheduler.stop()
        await admission.close()


def bound_elsewhere(api: FakeApiServer, name: str, node: str, minors: list[int], **extra: Any) -> str:
    """A running pod that already holds whole GPUs `minors` of `node` (bound by an earlier
    allocator instance, or any other path): the API state every allocator rebuilds from. `extra`
    goes to `member` (group, labels, priority). Its uid."""
    gib = 81559 * 2**20  # the DGX H100 fixture's GPU memory
    entries = [entry(m, {rn.GPU_CORE: 100, rn.GPU_MEMORY_RATIO: 100, rn.GPU_MEMORY: gib}) for m in minors]
    pod = member(
        name,
        gpus=len(minors),
        annotations={keys.DEVICE_ALLOCATED: DeviceAllocations({"gpu": entries}).to_json()},
        **extra,
    )
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": "Running"}
    return str(api.put(pod)["metadata"]["uid"])


def condition(status: JSON, type_: str) -> JSON:
    """The PodGroup status condition of `type_` ({} when there is none)."""
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), {})


def gang_runner(w: GangWorld) -> Any:
    """The gang controller's runner: a test waits for its next passes before it checks that
    nothing happened."""
    return w.service.component("gang").controller.runner
