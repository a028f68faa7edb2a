"""The per-workload limit a workload sets itself, read from the API: a Deployment's rolling
`maxUnavailable` (a ReplicaSet's pods answer to the Deployment that owns it), a StatefulSet's, and
the disruptions a PodDisruptionBudget selecting its pods allows now. The migration controller moves
no more of a workload's pods at once than the lowest of these and its own `maxMigratingPerWorkload`
(Koordinator's MigrationController reads maxUnavailable the same way)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from allocator.core.defrag.inputs import PodFacts
from allocator.runtime.kube import ApiError, KubeApi
from apis.kinds import DEPLOYMENTS, REPLICASETS, STATEFULSETS
from apis.selector import LabelSelector

log = logging.getLogger(__name__)
JSON = dict[str, Any]


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


def budget_allowed(budgets: Iterable[JSON], pods: Mapping[str, JSON]) -> dict[str, int]:
    """Per pod key, the fewest disruptions a PodDisruptionBudget selecting it allows now (those
    allowing none protect their pods outright: reading.protected_keys)."""
    out: dict[str, int] = {}
    for pdb in budgets:
        allowed = int((pdb.get("status") or {}).get("disruptionsAllowed", 0) or 0)
        namespace = (pdb.get("metadata") or {}).get("namespace") or "default"
        try:
            selector = LabelSelector.from_dict((pdb.get("spec") or {}).get("selector") or {}, "selector")
        except ValueError:
            continue
        for key, raw in pods.items():
            labels = (raw.get("metadata") or {}).get("labels") or {}
            if key.startswith(namespace + "/") and selector.matches(labels):
                out[key] = min(allowed, out.get(key, allowed))
    return out


def caps(
    facts: Iterable[PodFacts], owners: Mapping[str, JSON], allowed: Mapping[str, int]
) -> dict[str, tuple[int, str]]:
    """Per workload (as PodFacts names it), its own limit: the lowest of its owner's
    maxUnavailable (`owners`: the top object by workload) and its pods' budgets."""
    out: dict[str, tuple[int, str]] = {}
    for p in facts:
        if not p.workload:
            continue
        found = [c for c in (own_limit(owners.get(p.workload) or {}),) if c is not None]
        if p.key in allowed:
            found.append((allowed[p.key], "PodDisruptionBudget disruptionsAllowed"))
        if p.workload in out:
            found.append(out[p.workload])
        if found:
            out[p.workload] = min(found)
    return out


async def fetch_owners(api: KubeApi, workloads: Iterable[str]) -> dict[str, JSON]:
    """The object setting each workload's limit: a ReplicaSet's Deployment, a StatefulSet. One
    that cannot be read sets none (the settings' limit holds)."""
    out: dict[str, JSON] = {}
    for workload in sorted(set(workloads)):
        namespace, kind, name = [*workload.split("/", 2), "", ""][:3]
        try:
            if kind == "ReplicaSet":
                rs = await api.raw("GET", REPLICASETS.path(name, namespace=namespace))
                refs = (rs.get("metadata") or {}).get("ownerReferences") or []
                top = next((r for r in refs if r.get("controller") and r.get("kind") == "Deployment"), None)
                if top is not None:
                    got = await api.raw("GET", DEPLOYMENTS.path(top.get("name", ""), namespace=namespace))
                    out[workload] = {"kind": "Deployment", **got}
            elif kind == "StatefulSet":
                got = await api.raw("GET", STATEFULSETS.path(name, namespace=namespace))
                out[workload] = {"kind": "StatefulSet", **got}
        except ApiError as exc:
            log.info("reading the owner of %s: %s (its limit is the settings')", workload, exc)
    return out
