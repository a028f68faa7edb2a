"""Scarce-resource avoidance for every pod: a pod that requests no device gets, at creation, a
preferred node affinity for nodes without GPUs, so kube-scheduler keeps GPU nodes free for GPU pods
while other nodes have room (Koordinator's ScarceResourceAvoidance, which the extender cannot apply:
kube-scheduler never asks an extender about a pod requesting none of its managed resources).

A preference, not a requirement: when no node without GPUs fits, the pod still lands on a GPU node.
A pod that can only go to GPU nodes scores the same on all of them, so a term on a GPU pod would
change nothing; it is not added to one anyway, nor to a pod naming any extended resource or
ResourceClaim (it may need those nodes' devices), one created bound, a DaemonSet's (its node is
chosen), one for a scheduler we do not serve, or one that opts out (label `topoalloc.io/
scarce-avoidance: "false"` on the pod or its namespace; the webhook's selectors skip those too).
Never a denial: a pod this route cannot read is allowed unchanged, the API server judges it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from allocator.runtime.admission import on_any_thread, patched, pod_create
from allocator.runtime.scarce_settings import ScarceAvoidanceSettings
from allocator.runtime.tasks import Spawn
from apis import keys

JSON = dict[str, Any]
PATH = "/mutate-pods-scarce"
OPT_OUT = "false"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
# Resources every node offers (Koordinator's batch and mid tiers are `kubernetes.io/` names too);
# any other name is a device plugin's extended resource.
_PLAIN = frozenset(("cpu", "memory", "ephemeral-storage", "storage"))


def preferred_term(settings: ScarceAvoidanceSettings) -> JSON:
    """The term: nodes carrying none of the scarce-node labels get `weight`."""
    expressions = [{"key": key, "operator": "DoesNotExist"} for key in settings.node_labels]
    return {"weight": settings.weight, "preference": {"matchExpressions": expressions}}


def requests_only_plain(pod: JSON) -> bool:
    """Whether every resource the pod names is cpu, memory, storage or hugepages (no device)."""
    spec = pod["spec"]
    if spec.get("resourceClaims"):
        return False
    return all(_plain(name) for name in _resource_names(spec))


def _plain(name: Any) -> bool:
    return isinstance(name, str) and (
        name in _PLAIN or name.startswith("hugepages-") or name.startswith("kubernetes.io/")
    )


def _resource_names(spec: JSON) -> Iterator[Any]:
    blocks = [spec.get("resources")]
    for key in ("containers", "initContainers"):
        containers = spec.get(key)
        if isinstance(containers, list):
            blocks += [c.get("resources") for c in containers if isinstance(c, dict)]
    for block in blocks:
        if not isinstance(block, dict):
            continue
        for part in ("requests", "limits"):
            amounts = block.get(part)
            if isinstance(amounts, dict):
                yield from amounts
            elif amounts is not None:
                yield None  # unreadable: not ours to judge


def preference_patch(pod: JSON, settings: ScarceAvoidanceSettings) -> list[JSON] | None:
    """JSON patch operations adding the preferred term, or None when the pod is left alone."""
    meta, spec = pod.get("metadata"), pod.get("spec")
    if not isinstance(meta, dict) or not isinstance(spec, dict) or spec.get("nodeName"):
        return None
    labels = meta.get("labels")
    if isinstance(labels, dict) and labels.get(keys.SCARCE_AVOIDANCE) == OPT_OUT:
        return None
    scheduler = spec.get("schedulerName") or "default-scheduler"
    if settings.scheduler_names and scheduler not in settings.scheduler_names:
        return None
    owners = meta.get("ownerReferences")
    if isinstance(owners, list) and any(isinstance(o, dict) and o.get("kind") == "DaemonSet" for o in owners):
        return None
    if not requests_only_plain(pod):
        return None
    return _add_term(spec, preferred_term(settings))


def _add_term(spec: JSON, term: JSON) -> list[JSON] | None:
    """The operations adding `term` at the first level of spec.affinity that is missing (None: the
    term is there already, a reinvocation; or a level is not an object, which the API refuses)."""
    path, value = "/spec/affinity", {"nodeAffinity": {PREFERRED: [term]}}
    affinity = spec.get("affinity")
    if affinity is None:
        return [{"op": "add", "path": path, "value": value}]
    if not isinstance(affinity, dict):
        return None
    path, value, node = path + "/nodeAffinity", value["nodeAffinity"], affinity.get("nodeAffinity")
    if node is None:
        return [{"op": "add", "path": path, "value": value}]
    if not isinstance(node, dict):
        return None
    path, terms = path + "/" + PREFERRED, node.get(PREFERRED)
    if terms is None:
        return [{"op": "add", "path": path, "value": [term]}]
    if not isinstance(terms, list) or term in terms:
        return None
    return [{"op": "add", "path": path + "/-", "value": term}]


def reviewer(settings: ScarceAvoidanceSettings) -> Callable[[JSON], JSON]:
    def review(request: JSON) -> JSON:
        pod = pod_create(request)
        return patched(request["uid"], None if pod is None else preference_patch(pod, settings))

    return on_any_thread(review)  # its settings only


def routes(settings: ScarceAvoidanceSettings) -> dict[str, Callable[[JSON], JSON]]:
    """The admission route, on the allocator's webhook server (none when turned off)."""
    return {PATH: reviewer(settings)} if settings.enabled else {}


class ScarceAvoidance:
    """Scarce-resource avoidance as a component of the allocator process: its admission route alone."""

    name = "scarce"

    def __init__(self, settings: ScarceAvoidanceSettings) -> None:
        self.settings = settings

    def routes(self) -> dict[str, Callable[[JSON], JSON]]:
        return routes(self.settings)

    def observe(self, kind: str, key: str, obj: JSON | None) -> None:
        pass

    def steering(self) -> tuple[()]:
        return ()

    def start(self, spawn: Spawn) -> None:
        pass

    def stop(self) -> None:
        pass
