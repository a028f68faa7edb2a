"""Telling a claim that a device it was allocated is now tainted (a device that turned unhealthy
stays in its slice with a taint where the API serves device taints): one Warning Event on the
ResourceClaim per device and taint, said again only after the taint went and came back.

Pure: the allocated claims and the nodes' published devices in, Events out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from allocator.core.actions import Event, ObjectRef
from allocator.core.claims.published import NodeDevices
from apis import dra
from apis.dra_claims import ResourceClaim
from apis.dra_taints import NO_EXECUTE, NO_SCHEDULE

DEVICE_TAINTED = "DRADeviceTainted"

_WHAT = {
    NO_SCHEDULE: "no new claim is allocated it; pods already using it keep it",
    NO_EXECUTE: "kube-controller-manager evicts the pods using the claim unless they tolerate it",
}


class TaintNotices:
    def __init__(self) -> None:
        # (claim uid, node, device, taint key, effect, value) already told
        self._told: set[tuple[str, str, str, str, str, str]] = set()

    def step(self, claims: Iterable[ResourceClaim], published: Mapping[str, NodeDevices]) -> list[Event]:
        """Events for every allocated claim's device that carries a taint not told yet (the claims:
        all of them, so that what is no longer tainted is forgotten)."""
        seen: set[tuple[str, str, str, str, str, str]] = set()
        out = []
        for claim in claims:
            if claim.allocation is None:
                continue
            for r in claim.allocation.results:
                if r.driver != dra.DRIVER:
                    continue
                node = claim.allocation.node or r.pool
                pool = published.get(node)
                dev = pool.devices.get(r.device) if pool is not None and pool.pool == r.pool else None
                for taint in dev.taints if dev is not None else ():
                    tolerated = any(t.tolerates(taint) for t in r.tolerations)
                    key = (claim.uid, node, r.device, taint.key, taint.effect, taint.value)
                    seen.add(key)
                    if key in self._told:
                        continue
                    what = "the claim tolerates it" if tolerated else _WHAT.get(taint.effect, "")
                    since = f" since {taint.time_added}" if taint.time_added else ""
                    note = f"device {r.device} of node {node} is tainted {taint}{since}"
                    out.append(
                        Event(
                            ObjectRef(
                                claim.namespace,
                                claim.name,
                                claim.uid,
                                kind="ResourceClaim",
                                api_version=dra.API_VERSION,
                            ),
                            "Warning",
                            DEVICE_TAINTED,
                            f"{note}: {what}" if what else note,
                            action="Allocation",
                        )
                    )
        self._told = seen
        return out
