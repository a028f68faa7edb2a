"""Pod Events and metrics of the device plugins."""

from __future__ import annotations

import logging
from typing import Any, Protocol

from prometheus_client import Counter

from agent.events import post_event
from agent.kube import Kube

log = logging.getLogger(__name__)

REFUSALS = Counter(
    "topoalloc_agent_allocate_refusals",
    "Allocate calls refused because kubelet's devices were not the allocator's choice",
    ["resource"],
)
UNNAMED = Counter(
    "topoalloc_agent_admissions_without_pod_resources",
    "Device plugin calls whose pod was named without kubelet's PodResources (it did not answer)",
    ["resource"],
)
CHOSEN_ON_NODE = Counter(
    "topoalloc_agent_containers_served_by_node_choice",
    "Containers served with devices the node chose (their pod had no allocation for this node)",
    ["resource"],
)
MISMATCHES = Counter(
    "topoalloc_agent_device_mismatches",
    "Containers whose kubelet-assigned devices (PodResources) differ from the pod annotation",
    ["resource"],
)


class EventSink(Protocol):
    """Where the device plugins' Events on pods go."""

    def warn(self, pod: dict[str, Any], reason: str, message: str) -> None: ...

    def note(self, pod: dict[str, Any], reason: str, message: str) -> None:
        """A Normal Event."""
        ...


class NoEvents:
    """The sink of an agent without a cluster (`--print`): nowhere to post; the metrics still count."""

    def warn(self, pod: dict[str, Any], reason: str, message: str) -> None:
        pass

    def note(self, pod: dict[str, Any], reason: str, message: str) -> None:
        pass


NO_EVENTS = NoEvents()


class PodEvents:
    """Posts core/v1 Events on pods; a failure to post is logged, never raised."""

    def __init__(self, kube: Kube, node: str) -> None:
        self.kube = kube
        self.node = node

    def warn(self, pod: dict[str, Any], reason: str, message: str) -> None:
        self._post(pod, "Warning", reason, message)

    def note(self, pod: dict[str, Any], reason: str, message: str) -> None:
        self._post(pod, "Normal", reason, message)

    def _post(self, pod: dict[str, Any], kind: str, reason: str, message: str) -> None:
        meta = pod.get("metadata") or {}
        namespace = str(meta.get("namespace", "default"))
        involved = {"kind": "Pod", "namespace": namespace, "name": str(meta.get("name", ""))}
        post_event(self.kube, self.node, {**involved, "uid": str(meta.get("uid", ""))}, kind, reason, message)
