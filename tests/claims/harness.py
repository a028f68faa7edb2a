"""The claims controller against the fake API server: resource.k8s.io served, DRA-mode nodes
publishing their pools with the node side's slice builder, the real allocator (webhook, watch
cache, claims controller), and the small parts of kube-controller-manager and kube-scheduler the
tests need, done by hand:

* `make_claims` is the resourceclaim controller: a claim per template of a pod, controlled by the
  pod, with the template's annotations, and the pod's status.resourceClaimStatuses;
* `bind_like_kube_scheduler` is what kube-scheduler does with a pod whose claims are allocated:
  reserve them for the pod and bind it to their node; `refuse_like_kube_scheduler` is its
  PodScheduled=False/Unschedulable when another filter fails.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agent.dra.slices import pool_devices, pool_slices
from allocator.runtime.dra_settings import DraSettings
from allocator.runtime.runner import Runner
from apis import dra
from apis.device import Device
from tests.gang.harness import Admission
from tests.support.allocator_harness import Running, running_allocator
from tests.support.fakeapi import FakeApiServer
from tests.support.machines import machine_device
from tests.support.pki import Pki
from tests.support.polling import until

JSON = dict[str, Any]
REPO = Path(__file__).resolve().parents[2]
FAST = DraSettings(
    resync_period=0.5,
    batch_delay=0.01,
    retry_initial=0.1,
    retry_max=0.5,
    reallocate_after=1.0,
    release_after=0.5,
)
CLAIMS = "resourceclaims"


def serve_dra(fake: FakeApiServer) -> None:
    """resource.k8s.io/v1 on the fake, and topoalloc's DeviceClasses (deploy/dra)."""
    for plural, kind, namespaced, status in (
        ("resourceclaims", "ResourceClaim", True, True),
        ("resourceclaimtemplates", "ResourceClaimTemplate", True, False),
        ("deviceclasses", "DeviceClass", False, False),
        ("resourceslices", "ResourceSlice", False, False),
    ):
        fake.register_crd(
            dra.GROUP, dra.VERSION, plural, kind, namespaced=namespaced, status_subresource=status
        )
    for doc in yaml.safe_load_all((REPO / "deploy" / "dra" / "deviceclasses.yaml").read_text()):
        if doc:
            fake.put(doc)


def dra_node(
    fake: FakeApiServer, name: str, kind: str = "dgx-h100", *, mode: str = dra.MODE_DRA, cpu: str = "64"
) -> None:
    """A Node in `mode` with its Device CR and, in DRA mode, its pool's slices."""
    allocatable = {"cpu": cpu, "memory": "512Gi", "pods": "110"}
    labels = {"kubernetes.io/hostname": name, dra.MODE_LABEL: mode}
    fake.put(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": labels},
            "status": {"capacity": allocatable, "allocatable": allocatable},
        }
    )
    device = machine_device(kind, name)
    fake.put(device)
    if mode == dra.MODE_DRA:
        for s in pool_slices(name, pool_devices(Device.from_dict(device), max_vfs=8), 1):
            fake.put(s)


def make_claims(fake: FakeApiServer, pod_name: str) -> list[str]:
    """The resourceclaim controller's part for the pod: its template claims made; their names."""
    pod = fake.get("pods", pod_name, "default")
    assert pod is not None
    made, statuses = [], []
    for ref in pod["spec"].get("resourceClaims") or []:
        tname = ref.get("resourceClaimTemplateName")
        if not tname:
            continue
        tmpl = fake.get("resourceclaimtemplates", tname, "default")
        assert tmpl is not None, tname
        name = f"{pod_name}-{ref['name']}"
        obj = {
            "apiVersion": dra.API_VERSION,
            "kind": "ResourceClaim",
            "metadata": {
                "name": name,
                "namespace": "default",
                "annotations": {
                    **((tmpl["spec"].get("metadata") or {}).get("annotations") or {}),
                    "resource.kubernetes.io/pod-claim-name": ref["name"],
                },
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": pod_name,
                        "uid": pod["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": copy.deepcopy(tmpl["spec"]["spec"]),
        }
        fake.put(obj)
        made.append(name)
        statuses.append({"name": ref["name"], "resourceClaimName": name})
    pod = fake.get("pods", pod_name, "default")
    assert pod is not None
    pod.setdefault("status", {})["resourceClaimStatuses"] = statuses
    fake.put(pod)
    return made


def allocation(fake: FakeApiServer, name: str) -> JSON | None:
    obj = fake.get(CLAIMS, name, "default")
    return None if obj is None else (obj.get("status") or {}).get("allocation")


def devices_of(fake: FakeApiServer, name: str) -> list[str]:
    alloc = allocation(fake, name)
    return [r["device"] for r in (alloc or {}).get("devices", {}).get("results", [])]


def node_of_claim(fake: FakeApiServer, name: str) -> str:
    alloc = allocation(fake, name)
    assert alloc is not None, f"claim {name} is not allocated"
    return str(alloc["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"][0])


def gates(fake: FakeApiServer, pod: str) -> list[str]:
    obj = fake.get("pods", pod, "default")
    assert obj is not None
    return [g["name"] for g in obj["spec"].get("schedulingGates") or []]


def events(fake: FakeApiServer, reason: str) -> list[str]:
    found = fake.list_objects("events", "default")
    return [e.get("note") or e.get("message") or "" for e in found if e.get("reason") == reason]


def bind_like_kube_scheduler(fake: FakeApiServer, pod_name: str, claim_names: list[str]) -> str:
    """Reserve the claims for the pod and bind it to their node (what kube-scheduler does with a
    pod whose claims are allocated); the node."""
    pod = fake.get("pods", pod_name, "default")
    assert pod is not None
    node = node_of_claim(fake, claim_names[0])
    for name in claim_names:
        obj = fake.get(CLAIMS, name, "default")
        assert obj is not None
        obj["status"]["reservedFor"] = [{"resource": "pods", "name": pod_name, "uid": pod["metadata"]["uid"]}]
        fake.put(obj)
    pod["spec"]["nodeName"] = node
    fake.put(pod)
    return node


def refuse_like_kube_scheduler(fake: FakeApiServer, pod_name: str, message: str) -> None:
    pod = fake.get("pods", pod_name, "default")
    assert pod is not None
    cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
    pod.setdefault("status", {})["conditions"] = [cond]
    fake.put(pod)


@dataclass
class World:
    fake: FakeApiServer
    run: Running
    admission: Admission

    async def create_pod(self, pod: JSON) -> JSON:
        return await self.admission.create_pod(pod)

    async def create(self, obj: JSON) -> None:
        self.fake.put(obj)

    @property
    def runner(self) -> Runner:
        claims: Any = self.run.service.component("claims")
        return claims.runner  # type: ignore[no-any-return]

    async def looked_at(self, pod: str, made: Sequence[str] = ()) -> None:
        """Wait until the watch cache has the pod, with the claims `made` for it in its status and
        in the cache, then for two more passes of the claims controller (the first may have begun
        before): a check that nothing happened is made after the controller has looked."""
        cache = self.run.service.cache

        def seen() -> bool:
            entry = cache.pods.get(f"default/{pod}")
            if entry is None or entry.raw is None:
                return False
            statuses = (entry.raw.get("status") or {}).get("resourceClaimStatuses") or []
            named = {s.get("resourceClaimName") for s in statuses}
            return all(n in named and f"default/{n}" in cache.dra.claims for n in made)

        await until(seen, what=f"pod {pod} and its claims {', '.join(made)} in the watch cache")
        await self.runner.wait_passes(2)


@asynccontextmanager
async def claims_world(
    fake: FakeApiServer, pki: Pki, settings: DraSettings = FAST, **overrides: Any
) -> AsyncIterator[World]:
    async with running_allocator(fake, pki, dra=settings, **overrides) as run:
        url = f"https://127.0.0.1:{run.service.webhook_port}/mutate-pods-dra"
        admission = Admission(fake.url, url, pki)
        try:
            yield World(fake, run, admission)
        finally:
            await admission.close()
