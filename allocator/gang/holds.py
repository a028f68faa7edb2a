"""A gang's plan held in the hold ledger: its members' devices reserved on their planned nodes.

The hold ledger keeps holds as reservations without TTL (`HoldLedger.hold`); this module says what
they mean for gang scheduling: which pod is held for which gang, why bind and filter refuse a
held member elsewhere, and the reasons a hold could not be made.
"""

from __future__ import annotations

from allocator.gang.cache_view import GangLedger
from allocator.runtime.cache.records import Hold
from allocator.runtime.coreadapter import PodRequest, Rejection
from apis.annotations import DeviceAllocations

GANG_PLAN = "topoalloc: gang plan"


def planned_elsewhere(res: Hold) -> Rejection:
    """A planned member offered (filter) or bound (bind) to a node its plan does not name."""
    return Rejection(GANG_PLAN, f"gang {res.holder} planned this pod for node {res.node}")


def plan_refusal(res: Hold, req: PodRequest, node: str) -> Rejection | None:
    """Why the held pod `req` may not go to `node`: the plan is for an older pod of its name, or
    for another node. None: the plan says this node."""
    if req.uid and res.uid != req.uid:
        return Rejection(GANG_PLAN, f"gang {res.holder} planned an earlier pod of this name")
    if res.node != node:
        return planned_elsewhere(res)
    return None


class PlanHolds:
    """Gang members' planned devices, held in the cache from planning until bound or released."""

    def __init__(self, ledger: GangLedger) -> None:
        self.ledger = ledger

    def planned(self, key: str) -> Hold | None:
        """The pod's hold, if a gang's plan holds it."""
        res = self.ledger.holds.get(key)
        return res if res is not None and res.holder else None

    def reserve(
        self, key: str, uid: str, node: str, allocations: DeviceAllocations, req: PodRequest, gang: str
    ) -> Hold | Rejection:
        """Hold a member's planned devices on its planned node until it is bound there or
        `release`. Refused while the pod is bound or another reservation holds it."""
        got = self.ledger.hold(key, uid, node, allocations, req, gang)
        return Rejection(GANG_PLAN, got) if isinstance(got, str) else got

    def release(self, key: str, *, force: bool = False) -> bool:
        """Drop a member's hold unless its bind is under way; `force` drops it anyway."""
        return self.ledger.drop_hold(key, force=force)
