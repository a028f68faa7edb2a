"""The limits a workload sets itself: a Deployment's rolling `maxUnavailable` (a ReplicaSet's pods
answer to the Deployment that owns it), a StatefulSet's, and the disruptions a PodDisruptionBudget
selecting its pods allows now. The migration controller moves no more of a workload's pods at once
than each of these and its own `maxMigratingPerWorkload` allow (Koordinator's MigrationController
reads maxUnavailable the same way); a maxUnavailable also counts the workload's pods down now.

The owners are read from the API when a pass first needs one (a planned move of their pods) and
kept `OWNER_TTL` seconds (`Owners`), not watched: a plan moves the pods of a handful of workloads,
while watching every ReplicaSet, Deployment and StatefulSet would keep thousands of objects (every
Deployment's old ReplicaSets among them) in memory for them, and the fields read (replicas,
strategy) rarely change; a change is seen within `OWNER_TTL`."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from allocator.core.defrag.inputs import PodFacts
from allocator.core.defrag.migration import WorkloadCap
from allocator.runtime.kube import ApiError, KubeApi
from apis.kinds import DEPLOYMENTS, REPLICASETS, STATEFULSETS

log = logging.getLogger(__name__)
JSON = dict[str, Any]
OWNER_TTL = 60.0
BUDGET = "PodDisruptionBudget disruptionsAllowed"


def scaled(value: Any, replicas: int, default: str) -> int:
    """An intstr (`2`, `"25%"`) of `replicas`, rounded down as Kubernetes rounds maxUnavailable."""
    value = default if value is None else value
    text = str(value).strip()
    try:
        if text.endswith("%"):
            return max(0, int(text[:-1]) * replicas // 100)
        return max(0, int(text))
    except ValueError:
        return max(0, int(default.rstrip("%")) * replicas // 100) if default.endswith("%") else int(default)


def own_limit(obj: Mapping[str, Any]) -> tuple[int, str] | None:
    """(how many of its pods may be unavailable at once, which field says so); None: no limit of
    its own (a Deployment that recreates all its pods at once, an object of another kind)."""
    kind = obj.get("kind")
    spec = obj.get("spec") or {}
    replicas = int(spec.get("replicas", 1) or 0)
    if kind == "Deployment":
        strategy = spec.get("strategy") or {}
        if strategy.get("type") == "Recreate":
            return None
        rolling = strategy.get("rollingUpdate") or {}
        return scaled(rolling.get("maxUnavailable"), replicas, "25%"), "Deployment maxUnavailable"
    if kind == "StatefulSet":
        rolling = (spec.get("updateStrategy") or {}).get("rollingUpdate") or {}
        return scaled(rolling.get("maxUnavailable"), replicas, "1"), "StatefulSet maxUnavailable"
    return None


def unavailable(owner: Mapping[str, Any], ready: int, evicted: int) -> int:
    """The workload's pods down now that no move accounts for: its replicas (the owner's) not
    served by a pod bound and Ready (`ready`), less the moves in flight whose pod is evicted
    (their replacement is on its way: the move counts it). A pod missing (evicted and gone
    before its replacement exists) counts as much as one not Ready."""
    replicas = int((owner.get("spec") or {}).get("replicas", 1) or 0)
    return max(0, replicas - ready - evicted)


def caps(
    facts: Iterable[PodFacts],
    owners: Mapping[str, JSON],
    allowed: Mapping[str, int],
    unavailable: Mapping[str, int] | None = None,
) -> dict[str, tuple[WorkloadCap, ...]]:
    """Per workload (as PodFacts names it), the limits it sets itself: its owner's maxUnavailable
    (`owners`: the top object by workload), with its pods `unavailable` now, and the fewest
    disruptions a budget selecting one of its pods allows (`allowed`, by pod key)."""
    unavailable = unavailable or {}
    own: dict[str, WorkloadCap] = {}
    budget: dict[str, int] = {}
    for p in facts:
        if not p.workload:
            continue
        limit = own_limit(owners.get(p.workload) or {})
        if limit is not None:
            own[p.workload] = WorkloadCap(limit[0], limit[1], unavailable.get(p.workload, 0))
        if p.key in allowed:
            budget[p.workload] = min(allowed[p.key], budget.get(p.workload, allowed[p.key]))
    out: dict[str, tuple[WorkloadCap, ...]] = {}
    for workload in sorted(own.keys() | budget.keys()):
        found = [own[workload]] if workload in own else []
        if workload in budget:
            found.append(WorkloadCap(budget[workload], BUDGET))
        out[workload] = tuple(found)
    return out


class Owners:
    """The object setting each workload's limit (a ReplicaSet's Deployment, a StatefulSet), read
    when first asked for and kept `ttl` seconds. One that cannot be read sets none (the settings'
    limit holds) and is asked for again next time."""

    def __init__(self, api: KubeApi, *, ttl: float = OWNER_TTL, clock: Callable[[], float] = time.monotonic):
        self.api = api
        self.ttl = ttl
        self.clock = clock
        self._read: dict[str, tuple[float, JSON | None]] = {}  # workload -> (when read, its owner)

    def forget(self) -> None:
        self._read.clear()

    async def of(self, workloads: Iterable[str]) -> dict[str, JSON]:
        now = self.clock()
        self._read = {w: got for w, got in self._read.items() if now - got[0] < self.ttl}
        out: dict[str, JSON] = {}
        for workload in sorted(set(workloads)):
            if workload not in self._read:
                try:
                    self._read[workload] = (now, await self._fetch(workload))
                except ApiError as exc:
                    log.info("reading the owner of %s: %s (its limit is the settings')", workload, exc)
                    if exc.status != 404:
                        continue  # asked for again next time
                    self._read[workload] = (now, None)
            obj = self._read[workload][1]
            if obj is not None:
                out[workload] = obj
        return out

    async def _fetch(self, workload: str) -> JSON | None:
        namespace, kind, name = [*workload.split("/", 2), "", ""][:3]
        if kind == "ReplicaSet":
            rs = await self.api.raw("GET", REPLICASETS.path(name, namespace=namespace))
            refs = (rs.get("metadata") or {}).get("ownerReferences") or []
            top = next((r for r in refs if r.get("controller") and r.get("kind") == "Deployment"), None)
            if top is None:
                return None
            got = await self.api.raw("GET", DEPLOYMENTS.path(top.get("name", ""), namespace=namespace))
            return {"kind": "Deployment", **got}
        if kind == "StatefulSet":
            got = await self.api.raw("GET", STATEFULSETS.path(name, namespace=namespace))
            return {"kind": "StatefulSet", **got}
        return None
