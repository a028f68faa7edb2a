"""What an allocated ResourceClaim asks of this node: the devices of topoalloc's driver in this node's
pool, checked the way kubelet's Go helper checks a claim before it prepares it, with the share of a
sharable GPU a result names (its shareID and consumedCapacity).

Pure: the claim object in, `ClaimDevice`s or a `ClaimError` (the per-claim error kubelet shows) out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from apis import dra


class ClaimError(Exception):
    """The claim cannot be prepared here; the message is the per-claim error kubelet reports."""


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A claim as kubelet names it in NodePrepareResources."""

    namespace: str
    uid: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class ClaimDevice:
    """One allocation result of ours: the request it serves (base name, a `/subrequest` suffix
    stripped, as kubelet's helper sends it), the pool and the device."""

    request: str
    pool: str
    device: str
    admin_access: bool = False
    share_id: str = ""  # set: one of several allocations of a sharable device
    consumed: dict[str, int] | None = None  # consumedCapacity (memory bytes, cores); None: all of it


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def claim_devices(claim: dict[str, Any], ref: ClaimRef, pool: str) -> list[ClaimDevice]:
    """The devices of this driver in `pool` that `claim` was allocated. Raises ClaimError when the
    claim is not the one kubelet means (another UID: it was deleted and made again) or is not
    allocated; results of other drivers or other pools are not ours and are left alone."""
    meta = _mapping(claim.get("metadata"))
    uid = str(meta.get("uid", ""))
    if uid != ref.uid:
        raise ClaimError(
            f"claim {ref} has UID {uid or '(none)'}, kubelet asked for {ref.uid}: it was replaced"
        )
    allocation = _mapping(_mapping(claim.get("status")).get("allocation"))
    if not allocation:
        raise ClaimError(f"claim {ref} is not allocated (no status.allocation)")
    results = _mapping(allocation.get("devices")).get("results")
    if not isinstance(results, list):
        raise ClaimError(f"claim {ref}: status.allocation.devices.results is missing or not a list")
    out = []
    for i, result in enumerate(results):
        if not isinstance(result, dict):
            raise ClaimError(f"claim {ref}: allocation result {i} is not an object")
        if result.get("driver") != dra.DRIVER or result.get("pool") != pool:
            continue
        request, device = result.get("request"), result.get("device")
        if not isinstance(request, str) or not request or not isinstance(device, str) or not device:
            raise ClaimError(f"claim {ref}: allocation result {i} lacks its request or device name")
        try:
            consumed = dra.consumed_capacity(result)
        except ValueError as exc:
            raise ClaimError(f"claim {ref}: allocation result {i}: {exc}") from None
        out.append(
            ClaimDevice(
                request.split("/", 1)[0],
                pool,
                device,
                result.get("adminAccess") is True,
                dra.share_id(result),
                consumed,
            )
        )
    return out
