"""Which pod, and which of its containers, kubelet is admitting when it calls the plugin.

kubelet's device plugin calls carry device IDs, never the pod. kubelet's own PodResources `List`
names it: kubelet adds a pod to its pod manager before admitting it, lists every active pod with
every container, and records a container's devices only when its Allocate has returned. Admission
is one pod at a time, so while kubelet asks for resource R, exactly one listed container requests
R and holds none of it yet: that one. The pod's spec (for the request) and annotation come from
this node's pods in the API.

Without PodResources (socket missing, kubelet not answering) the pod is named only when a single
pending pod on this node still waits for R; otherwise the call is refused rather than guessed.

Pure: kubelet's list and the pods in, an `Admitting` or `Unidentified` out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.deviceplugin.expectation import ExpectationError, container_requests
from agent.deviceplugin.podresources import KubeletPods


@dataclass(frozen=True)
class Admitting:
    pod: dict[str, Any]
    container: int  # index among the pod's containers that request the resource
    count: int  # IDs that container requests; 0 when `error`
    error: str = ""  # the pod's requests cannot be read: refuse it with this reason


class Unidentified(Exception):
    """No single pod can be named; the message says why."""


def pod_key(pod: dict[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def pending(pod: dict[str, Any]) -> bool:
    meta = pod.get("metadata") or {}
    phase = (pod.get("status") or {}).get("phase") or "Pending"
    return phase == "Pending" and not meta.get("deletionTimestamp")


def _waiting(pod: dict[str, Any], resource: str, done: Callable[[str, int], bool]) -> Admitting | None:
    """The pod's first container requesting `resource` that `done` says is not served yet."""
    try:
        requests = container_requests(pod, resource)
    except ExpectationError as exc:
        return Admitting(pod, 0, 0, str(exc))
    for i, (name, count) in enumerate(requests):
        if not done(name, i):
            return Admitting(pod, i, count)
    return None


def from_kubelet(resource: str, kubelet: KubeletPods, pods: list[dict[str, Any]]) -> Admitting:
    """The container kubelet is admitting, named by its PodResources list. `pods`: this node's pods
    from the API. Raises Unidentified (the caller may refresh `pods` and ask again)."""
    ours = {pod_key(p): p for p in pods if pending(p)}
    found: list[Admitting] = []
    for key, containers in kubelet.items():
        pod = ours.get(key)
        if pod is None:
            continue
        hit = _waiting(pod, resource, lambda name, _i, c=containers: bool(c.get(name, {}).get(resource)))
        if hit is not None:
            found.append(hit)
    if len(found) == 1:
        return found[0]
    if not found:
        raise Unidentified(f"no pod kubelet is admitting on this node requests {resource}")
    names = ", ".join(sorted(pod_key(f.pod) for f in found))
    raise Unidentified(
        f"cannot tell which pod kubelet is admitting: {names} all wait for {resource} in PodResources"
    )


def without_kubelet(
    resource: str, pods: list[dict[str, Any]], served: Callable[[dict[str, Any], int], bool], why: str
) -> Admitting:
    """The fallback when PodResources is unavailable (`why`): the one pending pod of this node with a
    container this agent has not served `resource`. `served(pod, i)`: container i was served."""
    found = [
        hit
        for pod in pods
        if pending(pod) and (hit := _waiting(pod, resource, lambda _name, i, p=pod: served(p, i))) is not None
    ]
    if len(found) == 1:
        return found[0]
    if not found:
        raise Unidentified(f"no pending pod on this node requests {resource}")
    raise Unidentified(
        f"cannot tell which pod kubelet is admitting: {why}; "
        f"{len(found)} pending pods on this node wait for {resource}"
    )
