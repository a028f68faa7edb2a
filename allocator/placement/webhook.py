"""Placement's admission route: a pod asking for a device resource topoalloc manages is placed
before kube-scheduler sees it, whatever its scheduler. On the leader, a pod that has a controller is
placed here and now (admit.py: created pinned to its node, its devices recorded, no gate); any other
gets the gate `topoalloc.io/placement`, and the placement controller places it
(allocator/core/placement/lifecycle.py).

Left alone: a pod created bound (`spec.nodeName`), of an excluded namespace, labelled
`topoalloc.io/placement: "false"`, for a scheduler not served (when the settings name some), for a
scheduler topoalloc binds for itself (`bindFor`: placed and bound without a gate), asking for no
managed resource, or already placed (its recorded allocation and the node affinity pinning it
there: the route called again after a later webhook changed the pod). Never a denial: a pod this
route cannot read is allowed unchanged (the API server judges it). Gating reads the pod alone: no
API call, no cache, one pass over its containers (the webhook configuration's `matchConditions`
send it only pods that name such a resource anyway); placing adds one decode and the core's columns.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from allocator.placement.writes import pinned_to
from allocator.runtime.admission import BadReview, add_gate, patched, pod_create
from allocator.runtime.placement_settings import PlacementSettings
from apis import keys

log = logging.getLogger(__name__)
JSON = dict[str, Any]
# The pod as created and its namespace -> the JSON patch placing it now (None: gate it).
Admit = Callable[[JSON, JSON, str], "list[JSON] | None"]
PATH = "/mutate-pods-placement"
# The fallback entry's route (any replica, while the leader does not answer): it only gates.
GATE_PATH = "/mutate-pods-placement-gate"
OPT_OUT = "false"
SYSTEM_NAMESPACES = ("kube-system",)


def asks_for(pod: JSON, resources: frozenset[str]) -> bool:
    """Whether a container or init container of `pod` requests or limits one of `resources`."""
    spec = pod.get("spec") or {}
    for container in _containers(spec):
        res = container.get("resources") if isinstance(container, dict) else None
        if not isinstance(res, dict):
            continue
        for part in ("limits", "requests"):
            amounts = res.get(part)
            if isinstance(amounts, dict) and not resources.isdisjoint(amounts):
                return True
    return False


def _containers(spec: JSON) -> Iterable[Any]:
    for field in ("containers", "initContainers"):
        items = spec.get(field)
        if isinstance(items, list):
            yield from items


def gate_patch(pod: JSON, settings: PlacementSettings, namespace: str) -> list[JSON] | None:
    """JSON patch operations adding the placement gate, or None when the pod is left alone."""
    meta, spec = pod.get("metadata"), pod.get("spec")
    if not isinstance(meta, dict) or not isinstance(spec, dict) or spec.get("nodeName"):
        return None
    if namespace in settings.excluded_namespaces or namespace in SYSTEM_NAMESPACES:
        return None
    labels = meta.get("labels")
    if isinstance(labels, dict) and labels.get(keys.PLACEMENT) == OPT_OUT:
        return None
    scheduler = spec.get("schedulerName") or "default-scheduler"
    if settings.scheduler_names and scheduler not in settings.scheduler_names:
        return None
    if scheduler in settings.bind_for:
        return None  # no such scheduler runs: the controller places and binds it ungated
    if not asks_for(pod, frozenset(settings.resources)):
        return None
    if placed(pod):
        return None
    return add_gate(spec, keys.PLACEMENT_GATE)


def placed(pod: JSON) -> bool:
    """Whether the pod is placed already: its recorded allocation, pinned to that node."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    node = annotations.get(keys.ALLOCATED_NODE)
    return isinstance(node, str) and keys.DEVICE_ALLOCATED in annotations and pinned_to(pod, node)


def reviewer(
    settings: PlacementSettings, own_namespace: str = "", admit: Admit | None = None
) -> Callable[[JSON], JSON]:
    """The route's reviewer; pods of `own_namespace` (the allocator's) are never gated. `admit`:
    placing a pod that would be gated at once instead (admit.py), where it can."""

    def review(request: JSON) -> JSON:
        pod = pod_create(request)
        if pod is None:
            return patched(request["uid"], None)
        namespace = str(request.get("namespace") or (pod.get("metadata") or {}).get("namespace") or "")
        if own_namespace and namespace == own_namespace:
            return patched(request["uid"], None)
        try:
            gate = gate_patch(pod, settings, namespace)
            now = None
            if gate is not None and admit is not None:
                try:
                    now = admit(request, pod, namespace)
                except Exception:  # a bug here must not let the pod through unplaced: gate it
                    log.exception("placing %s/%s at admission", namespace, _name(pod))
            return patched(request["uid"], now if now is not None else gate)
        except BadReview:
            return patched(request["uid"], None)  # the API server judges a malformed pod

    return review


def _name(pod: JSON) -> str:
    meta = pod.get("metadata") or {}
    return str(meta.get("name") or meta.get("generateName") or "")
