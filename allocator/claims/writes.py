"""The claims controller's writes: a claim marked as topoalloc's and its allocation written (or
cleared) through resourceclaims/status, the pod's gate removed.

Every claim write carries the resourceVersion the decision was made on, so it fails (409) instead
of landing on a claim someone else changed meanwhile (kube-scheduler's own allocator, a re-created
claim); a gate removal tests the pod's uid and the gate's place.
"""

from __future__ import annotations

import logging
from typing import Any

from allocator.runtime.kube import MERGE_PATCH, RESOURCECLAIMS, ApiError, KubeApi
from apis import dra
from apis.dra_claims import DeviceResult, ResourceClaim, allocation_status

log = logging.getLogger(__name__)

JSON = dict[str, Any]
JSON_PATCH = "application/json-patch+json"


def claim_path(namespace: str, name: str) -> str:
    kind = RESOURCECLAIMS
    return f"/apis/{kind.group}/{kind.version}/namespaces/{namespace}/{kind.plural}/{name}"


async def mark(api: KubeApi, claim: ResourceClaim, resource_version: str) -> str:
    """Annotate the claim as allocated by topoalloc (before its allocation is written, so every
    allocation of ours carries the mark); its new resourceVersion."""
    patch = {
        "metadata": {
            "uid": claim.uid,
            "resourceVersion": resource_version,
            "annotations": {dra.ALLOCATED_BY_ANNOTATION: dra.ALLOCATED_BY},
        }
    }
    got = await api.raw(
        "PATCH", claim_path(claim.namespace, claim.name), body=patch, content_type=MERGE_PATCH
    )
    return str((got.get("metadata") or {}).get("resourceVersion") or "")


async def write_allocation(
    api: KubeApi, claim: ResourceClaim, resource_version: str, results: tuple[DeviceResult, ...], node: str
) -> str:
    """status.allocation: the results and the node selector naming `node`; the new resourceVersion."""
    body = {
        "metadata": {"uid": claim.uid, "resourceVersion": resource_version},
        "status": {"allocation": allocation_status(results, node)},
    }
    path = claim_path(claim.namespace, claim.name) + "/status"
    got = await api.raw("PATCH", path, body=body, content_type=MERGE_PATCH)
    return str((got.get("metadata") or {}).get("resourceVersion") or "")


async def clear_allocation(api: KubeApi, claim: ResourceClaim, resource_version: str) -> str:
    """Deallocate: status.allocation removed (the API server refuses while reservedFor is set)."""
    body = {
        "metadata": {"uid": claim.uid, "resourceVersion": resource_version},
        "status": {"allocation": None},
    }
    path = claim_path(claim.namespace, claim.name) + "/status"
    got = await api.raw("PATCH", path, body=body, content_type=MERGE_PATCH)
    return str((got.get("metadata") or {}).get("resourceVersion") or "")


async def remove_gate(api: KubeApi, namespace: str, name: str, uid: str, gates: list[str]) -> bool:
    """Remove the DRA gate from the pod (this pod only: uid tested). False when refused."""
    index = gates.index(dra.SCHEDULING_GATE)
    ops: list[JSON] = [{"op": "test", "path": "/metadata/uid", "value": uid}]
    if len(gates) == 1:
        ops += [
            {"op": "test", "path": "/spec/schedulingGates", "value": [{"name": dra.SCHEDULING_GATE}]},
            {"op": "remove", "path": "/spec/schedulingGates"},
        ]
    else:
        ops += [
            {"op": "test", "path": f"/spec/schedulingGates/{index}/name", "value": dra.SCHEDULING_GATE},
            {"op": "remove", "path": f"/spec/schedulingGates/{index}"},
        ]
    try:
        await api.raw(
            "PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}", body=ops, content_type=JSON_PATCH
        )
    except ApiError as exc:
        log.warning("removing the DRA gate of %s/%s: %s", namespace, name, exc)
        return False
    return True
