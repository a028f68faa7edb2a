"""Why a pod waits, from what the cluster says of it: each scheduling gate of topoalloc's (who
removes it and the latest word on why not yet: the placement condition, topoalloc's Events), the
gates of others, kube-scheduler's verdict on an ungated pod that is not bound, and kubelet's word on
a bound pod that does not start. Pure: the pod and its Events in, sentences out; `topoalloc
explain pod` and `topoalloc doctor` say the same."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from apis import dra, keys
from apis.timestamps import parse_time

JSON = dict[str, Any]
PLACED = keys.TOPOALLOC + "Placed"  # placement's pod condition (allocator/core/placement/lifecycle.py)
# topoalloc's gates: what removes each, and the Event reasons that speak of it.
GATES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    keys.PLACEMENT_GATE: (
        "placement",
        "the allocator removes it once it has chosen the pod's node and devices",
        ("FailedPlacement", "PlacementNotWritten", "Preempting", "Replacing"),
    ),
    keys.GANG_SCHEDULING_GATE: (
        "gang",
        "the gang controller removes it once the whole gang is placed",
        ("GangWaiting", "GangIncomplete", "GangFailed", "GangPreempting", "GangHoldingRoom"),
    ),
    dra.SCHEDULING_GATE: (
        "dra",
        "the claims controller removes it once the pod's claims are allocated",
        ("DRAAllocationFailed", "DRAClaimRefused", "DRAReallocationFailed"),
    ),
}
NO_WORD = "no Event or condition from topoalloc yet (is an allocator leading?)"


@dataclass(frozen=True)
class Wait:
    what: str  # a gate's name, "scheduling" (not bound) or "starting" (bound, not started)
    owner: str  # who moves it on: placement, gang, dra, kube-scheduler, kubelet, another controller
    how: str  # what moves it on
    why: str  # the latest word on why not yet ("" when there is none)
    since: float | None = None

    def as_data(self) -> JSON:
        out: JSON = {"what": self.what, "owner": self.owner, "how": self.how, "why": self.why}
        if self.since is not None:
            out["since"] = self.since
        return out


def conditions(pod: JSON) -> dict[str, JSON]:
    return {
        str(c.get("type")): c
        for c in (pod.get("status") or {}).get("conditions") or []
        if isinstance(c, dict)
    }


def event_time(event: JSON) -> float:
    """When an Event last happened (its series, last timestamp or event time)."""
    for value in (
        (event.get("series") or {}).get("lastObservedTime"),
        event.get("lastTimestamp"),
        event.get("eventTime"),
        event.get("firstTimestamp"),
        (event.get("metadata") or {}).get("creationTimestamp"),
    ):
        stamp = parse_time(value)
        if stamp is not None:
            return stamp
    return 0.0


def reporter(event: JSON) -> str:
    """Who wrote an Event: its reporting controller, else its source component."""
    return str(
        event.get("reportingComponent")
        or event.get("reportingController")
        or (event.get("source") or {}).get("component")
        or ""
    )


def latest(events: Sequence[JSON], reasons: Sequence[str] = (), reporter_prefix: str = "") -> JSON | None:
    found = [
        e
        for e in events
        if (not reasons or e.get("reason") in reasons)
        and (not reporter_prefix or reporter(e).startswith(reporter_prefix))
    ]
    return max(found, key=event_time) if found else None


def _said(event: JSON | None) -> str:
    return f"{event.get('reason')}: {event.get('message', '')}".strip() if event else ""


def waits(pod: JSON, events: Sequence[JSON]) -> list[Wait]:
    """Each thing the pod waits for, in the order they are met (gates first)."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp") or status.get("phase") in ("Succeeded", "Failed"):
        return []
    created = parse_time(meta.get("creationTimestamp"))
    out = []
    for gate in (g.get("name") for g in spec.get("schedulingGates") or []):
        if gate in GATES:
            owner, how, reasons = GATES[gate]
            why = ""
            placed = conditions(pod).get(PLACED)
            if gate == keys.PLACEMENT_GATE and placed and placed.get("status") == "False":
                why = f"{placed.get('reason')}: {placed.get('message', '')}"
            why = why or _said(latest(events, reasons)) or NO_WORD
            out.append(Wait(str(gate), owner, how, why, created))
        else:
            out.append(
                Wait(str(gate), "another controller", "whoever added this gate removes it", "", created)
            )
    if out:
        return out
    cond = conditions(pod)
    if not spec.get("nodeName"):
        scheduled = cond.get("PodScheduled") or {}
        why = scheduled.get("message") or _said(latest(events, ("FailedScheduling",))) or "not looked at yet"
        since = parse_time(scheduled.get("lastTransitionTime")) or created
        scheduler = spec.get("schedulerName") or "default-scheduler"
        return [Wait("scheduling", scheduler, f"{scheduler} binds it to a node", why, since)]
    started = any(
        (c.get("state") or {}).get("running") or (c.get("state") or {}).get("terminated")
        for c in status.get("containerStatuses") or []
    )
    if status.get("phase") == "Pending" and not started:
        since = parse_time((cond.get("PodScheduled") or {}).get("lastTransitionTime")) or created
        word = latest([e for e in events if e.get("type") == "Warning"], reporter_prefix="kubelet")
        return [
            Wait(
                "starting",
                "kubelet",
                f"kubelet on {spec['nodeName']} prepares its devices and starts it",
                _said(word),
                since,
            )
        ]
    return []
