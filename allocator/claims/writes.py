"""The claims controller's writes: a claim marked as topoalloc's and its allocation written (or
cleared) through resourceclaims/status, the pod's gate removed, a pod evicted.

An allocation is written together with the reservation for the pod it was made for
(status.reservedFor), as kube-scheduler's own allocator writes both at once: kube-scheduler's PreBind
then writes nothing for a claim already reserved for the pod it binds. A clear removes both (the
API server refuses a reservation without an allocation).

Every claim write carries the resourceVersion the decision was made on, so it fails (409) instead
of landing on a claim someone else changed meanwhile (kube-scheduler's own allocator, a re-created
claim); a gate removal tests the pod's uid and the gate's place (allocator/runtime/gates.py). The
controller rolls back and reports a refused claim write itself: those raise ApiError.
"""

from __future__ import annotations

from typing import Any

from allocator.runtime import gates
from allocator.runtime.kube import KubeApi, Written
from apis import dra
from apis.dra_claims import DeviceResult, ResourceClaim, allocation_status
from apis.kinds import PODS, RESOURCECLAIMS

JSON = dict[str, Any]


def _guarded(claim: ResourceClaim, resource_version: str) -> JSON:
    """The metadata every claim write carries: the claim's uid and the resourceVersion decided on."""
    return {"uid": claim.uid, "resourceVersion": resource_version}


async def _write(api: KubeApi, claim: ResourceClaim, body: JSON, subresource: str = "") -> str:
    """Merge-patch the claim (or its status); its new resourceVersion. Raises ApiError if refused."""
    path = RESOURCECLAIMS.path(claim.name, namespace=claim.namespace, subresource=subresource)
    return (await api.patch(path, body, what=None)).or_raise().resource_version


async def mark(api: KubeApi, claim: ResourceClaim, resource_version: str) -> str:
    """Annotate the claim as allocated by topoalloc (before its allocation is written, so every
    allocation of ours carries the mark); its new resourceVersion."""
    meta = {
        **_guarded(claim, resource_version),
        "annotations": {dra.ALLOCATED_BY_ANNOTATION: dra.ALLOCATED_BY},
    }
    return await _write(api, claim, {"metadata": meta})


def reservation(pod: JSON) -> JSON:
    """The status.reservedFor entry of a pod, as kube-scheduler writes it."""
    meta = pod.get("metadata") or {}
    return {"resource": "pods", "name": meta.get("name") or "", "uid": meta.get("uid") or ""}


async def write_allocation(
    api: KubeApi,
    claim: ResourceClaim,
    resource_version: str,
    results: tuple[DeviceResult, ...],
    node: str,
    for_pod: JSON | None = None,
) -> str:
    """status.allocation: the results and the node selector naming `node`, and with `for_pod` the
    claim reserved for that pod in the same write; the new resourceVersion."""
    status: JSON = {"allocation": allocation_status(results, node)}
    if for_pod is not None:
        status["reservedFor"] = [reservation(for_pod)]
    body = {"metadata": _guarded(claim, resource_version), "status": status}
    return await _write(api, claim, body, "status")


async def clear_allocation(api: KubeApi, claim: ResourceClaim, resource_version: str) -> str:
    """Deallocate: status.allocation and status.reservedFor removed in one write (a reservation
    without an allocation is refused, so both go together)."""
    status = {"allocation": None, "reservedFor": None}
    body = {"metadata": _guarded(claim, resource_version), "status": status}
    return await _write(api, claim, body, "status")


async def remove_gate(api: KubeApi, namespace: str, name: str, uid: str, pod_gates: list[str]) -> bool:
    """Remove the DRA gate from the pod (this pod only: uid tested). False when refused."""
    pod = gates.PodGates(namespace, name, uid, tuple(pod_gates))
    return await gates.remove_gate(api, pod, dra.SCHEDULING_GATE)


async def evict(api: KubeApi, namespace: str, name: str, uid: str) -> str:
    """Evict the pod through the Eviction API (its uid the precondition, budgets honoured): "" when
    done or gone, else why not (a budget allowing no disruption yet: tried again on a later pass)."""
    body = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
        "deleteOptions": {"preconditions": {"uid": uid}},
    }
    path = PODS.path(name, namespace=namespace, subresource="eviction")
    got = await api.create(path, body, what=f"evicting {namespace}/{name}", quiet=(404, 409, 429))
    if isinstance(got, Written) or got.status in (404, 409):
        return ""
    return "a PodDisruptionBudget allows no disruption now" if got.status == 429 else str(got)
