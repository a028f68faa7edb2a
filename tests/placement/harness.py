"""End-to-end support for placement tests: the fake API server, the real allocator with placement
on, the API server's admission chain (every webhook route of the allocator, in order) and a
stand-in for kube-scheduler as placement mode runs it: no extender; a pod with no gate left is bound
on its nominated node (kube-scheduler tries that node first), unless the test makes that node refuse
it for a reason topoalloc does not model (then on another node with room by kube-scheduler's own
count of nvidia.com/gpu, or left Unschedulable with kube-scheduler's condition)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import ssl
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import jsonpatch

from allocator.runtime.gang_settings import GangSettings
from allocator.runtime.placement_settings import PlacementSettings
from apis import keys
from apis.timestamps import format_time
from tests.gang.harness import FAST, RACK, gpu_node
from tests.support.allocator_harness import GPU, Running, running_allocator
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Pki

JSON = dict[str, Any]
ROUTES = ("/mutate-pods", "/mutate-pods-placement")  # the webhook configuration's order

__all__ = ["GPU", "PlacementWorld", "gpu_node", "gpu_pod", "placement_world"]


def gpu_pod(name: str, gpus: int = 1, *, namespace: str = "default", **extra: Any) -> JSON:
    limits = {GPU: str(gpus), "cpu": "1", "memory": "1Gi"}
    pod: JSON = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, **extra.pop("metadata", {})},
        "spec": {"containers": [{"name": "c", "image": "cuda", "resources": {"limits": limits}}], **extra},
    }
    return pod


class Admission:
    """Pods created through every admission route of the allocator, as the API server does."""

    def __init__(self, api_url: str, webhook: str, pki: Pki) -> None:
        self.api_url, self.webhook = api_url, webhook
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(pki.dir / "ca.crt"))
        self.hook = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx))
        self.plain = aiohttp.ClientSession()

    async def close(self) -> None:
        await self.hook.close()
        await self.plain.close()

    async def create_pod(self, pod: JSON) -> JSON:
        namespace = pod["metadata"].get("namespace", "default")
        for route in ROUTES:
            request = {"uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
                       "namespace": namespace, "operation": "CREATE", "object": pod}  # fmt: skip
            review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
            async with self.hook.post(self.webhook + route, json=review) as resp:
                assert resp.status == 200, await resp.text()
                answer = (await resp.json())["response"]
            assert answer["allowed"], answer
            if answer.get("patch"):
                pod = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(answer["patch"])))
        async with self.plain.post(f"{self.api_url}/api/v1/namespaces/{namespace}/pods", json=pod) as resp:
            body = await resp.json()
            assert resp.status == 201, body
            return dict(body)


@dataclass
class NominatedScheduler:
    """kube-scheduler without an extender, as far as placement mode needs it."""

    fake: FakeApiServer
    refuse: dict[str, str] = field(default_factory=dict)  # node -> why kube-scheduler refuses it
    binds: list[tuple[str, str]] = field(default_factory=list)  # (pod, node)
    held: set[str] = field(default_factory=set)  # pod names the test keeps unbound

    def __post_init__(self) -> None:
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self) -> None:
        while True:
            for pod in self.fake.list_objects("pods", None):
                meta, spec = pod["metadata"], pod.get("spec") or {}
                if spec.get("nodeName") or spec.get("schedulingGates") or meta.get("deletionTimestamp"):
                    continue
                if meta["name"] in self.held:
                    continue
                self._schedule(pod)
            await asyncio.sleep(0.02)

    def _schedule(self, pod: JSON) -> None:
        allowed = _affinity_nodes(pod)
        nominated = (pod.get("status") or {}).get("nominatedNodeName") or ""
        if nominated and nominated not in self.refuse and (allowed is None or nominated in allowed):
            return self._bind(pod, nominated)
        for node in sorted(n["metadata"]["name"] for n in self.fake.list_objects("nodes", None)):
            if allowed is not None and node not in allowed:
                continue
            if node not in self.refuse and self._gpus_free(node) >= _gpus(pod):
                return self._bind(pod, node)
        why = "; ".join(f"{n}: {w}" for n, w in sorted(self.refuse.items())) or "Insufficient nvidia.com/gpu"
        why = f"0/{len(self.fake.list_objects('nodes', None))} nodes are available: {why}"  # its fit error
        status = pod.get("status") or {}
        conds = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
        if any(c.get("message") == why for c in status.get("conditions") or []):
            return None
        conds.append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                      "message": why, "lastTransitionTime": format_time()})  # fmt: skip
        pod["status"] = {**status, "conditions": conds}
        self.fake.put(pod)
        return None

    def _gpus_free(self, node: str) -> int:
        alloc = int(self.fake.get("nodes", node)["status"]["allocatable"].get(GPU, "0"))
        used = sum(
            _gpus(p) for p in self.fake.list_objects("pods", None) if p["spec"].get("nodeName") == node
        )
        return alloc - used

    def _bind(self, pod: JSON, node: str) -> None:
        pod["spec"]["nodeName"] = node
        pod["status"] = {**(pod.get("status") or {}), "phase": "Running"}
        self.fake.put(pod)
        self.binds.append((pod["metadata"]["name"], node))


def _affinity_nodes(pod: JSON) -> set[str] | None:
    """The nodes the pod's required `metadata.name In` terms allow (None: no such term)."""
    required = ((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    allowed: set[str] | None = None
    for term in (required or {}).get("nodeSelectorTerms") or []:
        for field_ in term.get("matchFields") or []:
            if field_.get("key") == "metadata.name" and field_.get("operator") == "In":
                values = set(field_.get("values") or [])
                allowed = values if allowed is None else allowed & values
    return allowed


def _gpus(pod: JSON) -> int:
    return sum(
        int((c.get("resources") or {}).get("limits", {}).get(GPU, 0)) for c in pod["spec"]["containers"]
    )


@dataclass
class PlacementWorld:
    fake: FakeApiServer
    run: Running
    admission: Admission
    scheduler: NominatedScheduler

    @property
    def runner(self) -> Any:
        return self.run.service.component("placement").runner

    def pod(self, name: str, namespace: str = "default") -> JSON:
        return dict(self.fake.get("pods", name, namespace))

    def events_about(self, name: str) -> list[JSON]:
        """The pod's Events, each with `reason` and `note` (either API's shape)."""
        out = []
        for e in self.fake.list_objects("events", None):
            regarding = e.get("involvedObject") or e.get("regarding") or {}
            if regarding.get("name") == name and regarding.get("kind") == "Pod":
                out.append({**e, "note": e.get("note") or e.get("message") or ""})
        return out


def placement_settings(**overrides: Any) -> PlacementSettings:
    settings = PlacementSettings(
        enabled=True, resync_period=1.0, batch_delay=0.01, retry_initial=0.1, retry_max=0.5
    )
    for key, value in overrides.items():
        setattr(settings, key, value)
    return settings


@asynccontextmanager
async def placement_world(
    fake: FakeApiServer, pki: Pki, *, gang: GangSettings | None = None, **placement: Any
) -> AsyncIterator[PlacementWorld]:
    gang = gang or GangSettings(topology_keys=[RACK], **FAST)
    async with running_allocator(fake, pki, placement=placement_settings(**placement), gang=gang) as run:
        admission = Admission(fake.url, f"https://127.0.0.1:{run.service.webhook_port}", pki)
        scheduler = NominatedScheduler(fake)
        await scheduler.start()
        try:
            yield PlacementWorld(fake, run, admission, scheduler)
        finally:
            await scheduler.stop()
            await admission.close()


def allocated(pod: JSON) -> tuple[str, list[int]]:
    """The node and GPU minors a pod's recorded allocation names."""
    annotations = pod["metadata"].get("annotations") or {}
    recorded = json.loads(annotations.get(keys.DEVICE_ALLOCATED, "{}"))
    return annotations.get(keys.ALLOCATED_NODE, ""), sorted(e["minor"] for e in recorded.get("gpu", []))
