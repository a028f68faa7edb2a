"""A gang's held room, recorded on its members in the API so a restarted or newly elected
allocator continues the hold instead of planning (and evicting) afresh.

While a gang waits for its victims to leave (preemption) or for pods to finish (a starvation
hold), each member carries the annotation `topoalloc.io/gang-hold`:

    {"plan": "<id>", "node": "n3", "devices": <device-allocated>, "victims": {"ns/pod": "uid"},
     "evict": true}

`plan` is the same on every member of one hold. A new leader restores the hold when every member
it would plan carries a record of one plan: it reserves the recorded devices on the recorded nodes
and waits for the recorded victims (evicting those still there). Records are removed when the
hold ends (members released, or the hold given up); a record that does not decode, or members
whose records disagree, are ignored (the gang is planned afresh).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from allocator.core.devices.allocate import Allocation
from allocator.core.gang.plan import GangPlan, Placement
from allocator.core.gang.victims import Candidate
from allocator.core.gang.view import MemberPod
from apis import keys
from apis.annotations import DeviceAllocations
from apis.errors import CodecError


@dataclass(frozen=True)
class HoldRecord:
    plan: str
    node: str
    devices: DeviceAllocations
    victims: dict[str, str]  # pod key -> uid
    evict: bool

    def to_json(self) -> str:
        return json.dumps(
            {
                "plan": self.plan,
                "node": self.node,
                "devices": self.devices.to_dict(),
                "victims": dict(sorted(self.victims.items())),
                "evict": self.evict,
            },
            separators=(",", ":"),
        )


def read_record(m: MemberPod) -> HoldRecord | None:
    raw = m.annotations.get(keys.GANG_HOLD)
    if not raw:
        return None
    try:
        data: Any = json.loads(raw)
        devices = DeviceAllocations.from_dict(data["devices"])
        victims = {str(k): str(v) for k, v in dict(data.get("victims") or {}).items()}
        evict = bool(data.get("evict", True))
        return HoldRecord(str(data["plan"]), str(data["node"]), devices, victims, evict)
    except (ValueError, KeyError, TypeError, AttributeError, CodecError):
        return None


def restorable(members: list[MemberPod]) -> tuple[GangPlan, HoldRecord] | None:
    """The plan every member's record names, when all of them carry one of the same plan."""
    records = [read_record(m) for m in members]
    if not records or any(r is None for r in records) or len({r.plan for r in records if r}) != 1:
        return None
    placements = tuple(
        Placement(m.key, r.node, Allocation(r.devices)) for m, r in zip(members, records, strict=True) if r
    )
    return GangPlan(placements, 0.0, ""), records[0]  # type: ignore[return-value]


def victims_of(record: HoldRecord, node_of: dict[str, str]) -> list[Candidate]:
    return [Candidate(key, node_of.get(key, ""), 0, "", uid) for key, uid in record.victims.items()]
