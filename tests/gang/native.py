"""Kubernetes' own gangs in the fake-API gang world: the alpha API served, its objects, its members,
and a fingerprint of what the allocator holds (to show filter calls leave nothing behind)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from allocator.assembly import Allocator
from allocator.runtime.cache.store import ClusterCache
from allocator.runtime.coreadapter import CoreAdapter
from allocator.runtime.kube import DEVICES, NODES, PODS
from apis import keys
from apis.gang_object import status_of_native
from tests.gang.harness import GangWorld, member, podgroup
from tests.support.fakeapi import FakeApiServer
from tests.support.fakeapi.builtin import native_gang_types

JSON = dict[str, Any]
PODGROUPS_V1ALPHA2 = "/apis/scheduling.k8s.io/v1alpha2/namespaces/default/podgroups"
WORKLOADS_V1ALPHA1 = "/apis/scheduling.k8s.io/v1alpha1/namespaces/default/workloads"


def serve_native_gangs(fake: FakeApiServer, version: str = "v1alpha2") -> None:
    """Turn the alpha API on, as the gates and runtime-config do on a real server."""
    fake.serve(*native_gang_types(version))


def native_podgroup(name: str, min_count: int | None, **annotations: str) -> JSON:
    """A v1alpha2 PodGroup: `gang: {minCount}`, or `basic: {}` for None."""
    policy: JSON = {"gang": {"minCount": min_count}} if min_count is not None else {"basic": {}}
    meta: JSON = {"name": name, "namespace": "default"}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {
        "apiVersion": "scheduling.k8s.io/v1alpha2",
        "kind": "PodGroup",
        "metadata": meta,
        "spec": {"schedulingPolicy": policy},
    }


def workload_v1alpha1(name: str, groups: dict[str, int]) -> JSON:
    """A 1.35 Workload whose pod groups (name -> minCount) are gangs."""
    return {
        "apiVersion": "scheduling.k8s.io/v1alpha1",
        "kind": "Workload",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"podGroups": [{"name": g, "policy": {"gang": {"minCount": n}}} for g, n in groups.items()]},
    }


def joined(pod: JSON, group: str, *, workload: str = "") -> JSON:
    """`pod` in native group `group`: a 1.36 PodGroup, or the pod group of 1.35 Workload `workload`."""
    if workload:
        pod["spec"]["workloadRef"] = {"name": workload, "podGroup": group}
    else:
        pod["spec"]["schedulingGroup"] = {"podGroupName": group}
    return pod


def native_condition(fake: FakeApiServer, name: str, type_: str) -> str:
    """The status ("True", "False", "" for none) of a v1alpha2 PodGroup's condition."""
    obj = fake.get("podgroups.scheduling.k8s.io", name, "default") or {}
    found = [c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == type_]
    return str(found[0]["status"]) if found else ""


def fingerprint(service: Allocator) -> tuple[object, ...]:
    """What the allocator holds: the ledger's entries, every pod's and entry's devices, and the
    devices the core counts as taken, per node and type."""
    cache = service.cache
    ledger = sorted(
        (k, r.uid, r.node, r.annotation, r.holder, r.binding) for k, r in cache.ledger.holds.items()
    )
    return ledger, sorted(cache.holdings().items()), sorted(cache.allocated_devices())


def rebuilt(service: Allocator, fake: FakeApiServer) -> tuple[object, ...]:
    """What a fresh cache fed the API's objects now holds (devices per pod, taken per node): the
    allocator's own cache must not have drifted from it."""
    cache = ClusterCache(CoreAdapter(service.config.scoring))
    for kind, resource in ((NODES, "nodes"), (DEVICES, "devices"), (PODS, "pods")):
        cache.replace(kind, fake.list_objects(resource))
    return sorted(cache.holdings().items()), sorted(cache.allocated_devices())


@dataclass(frozen=True)
class GangKind:
    """How a fake-API gang test defines its gangs: a scheduler-plugins PodGroup (members gated) or a
    1.36 PodGroup of Kubernetes' own (members steered, as where kube-scheduler's gang plugin runs;
    the stand-in kube-scheduler has no such plugin, so the extender alone holds them)."""

    id: str

    @property
    def native(self) -> bool:
        return self.id == "native"

    async def create_group(self, w: GangWorld, name: str, min_member: int) -> None:
        if self.native:
            await w.admission.create(PODGROUPS_V1ALPHA2, native_podgroup(name, min_member))
        else:
            await w.admission.create_podgroup(podgroup(name, min_member))

    def member(self, name: str, group: str, **kwargs: Any) -> JSON:
        if self.native:
            return joined(member(name, **kwargs), group)
        return member(name, group=group, **kwargs)

    def status(self, w: GangWorld, name: str) -> JSON:
        """The gang's status in scheduler-plugins' terms: a native PodGroup's topoalloc.io/
        conditions read back, its phase told by them (no phase field there)."""
        if not self.native:
            return w.podgroup_status(name)
        obj = w.fake.get("podgroups.scheduling.k8s.io", name, "default") or {}
        status = status_of_native((obj.get("status") or {}).get("conditions") or []).to_dict()
        true = {c["type"] for c in status.get("conditions") or [] if c.get("status") == "True"}
        phases = (("TimedOut", "Failed"), ("Scheduled", "Scheduled"), ("Waiting", "PreScheduling"))
        status["phase"] = next((p for c, p in phases if c in true), "Pending")
        return status

    def gates(self) -> list[str]:
        """What a member waiting for its gang carries."""
        return [] if self.native else [keys.GANG_SCHEDULING_GATE]


GANG_KINDS = (GangKind("scheduler-plugins"), GangKind("native"))
