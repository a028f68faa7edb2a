"""A PodGroup's status as the gang lifecycle computes it from its members (the phases of the
scheduler-plugins coscheduling API: Pending, PreScheduling, Scheduling, Scheduled, Running,
Finished, Failed)."""

from __future__ import annotations

from typing import Any

from allocator.core.gang.gang_state import GangState
from allocator.core.gang.view import Gang
from apis.timestamps import format_time

JSON = dict[str, Any]


def podgroup_status(
    gang: Gang,
    planned: int,
    failed: bool,
    start: float | None,
    recorded: JSON,
    *,
    waiting: tuple[str, str] | None = None,
    preempting: str = "",
    now: float = 0.0,
) -> JSON:
    """The status to write: `planned` members hold a plan, `failed` says the gang timed out,
    `start` is when it first had its minimum, `recorded` the status written last; `waiting` is
    (reason code, why) while the gang waits, `preempting` says what is being evicted for it."""
    members = gang.members
    scheduled = sum(1 for m in members if m.node)
    running = sum(1 for m in members if m.phase == "Running")
    succeeded = sum(1 for m in members if m.phase == "Succeeded")
    dead = sum(1 for m in members if m.phase == "Failed")
    active = gang.active
    bound = sum(1 for m in active if m.node)
    if failed:
        phase = "Failed"
    elif succeeded >= gang.min_member and not active:
        phase = "Finished"
    elif running >= gang.min_member:
        phase = "Running"
    elif bound >= gang.min_member:
        phase = "Scheduled"
    elif bound + planned >= gang.min_member:
        phase = "Scheduling"
    elif len(active) >= gang.min_member and not gang.problem:
        phase = "PreScheduling"
    else:
        phase = "Pending"
    status: JSON = {
        "phase": phase,
        "scheduled": scheduled,
        "running": running,
        "succeeded": succeeded,
        "failed": dead,
        "scheduleStartTime": format_time(start) if start is not None else None,
    }
    if phase == "Failed" and recorded.get("scheduleStartTime"):
        status["scheduleStartTime"] = recorded["scheduleStartTime"]
    placed = phase in ("Scheduled", "Running", "Finished")
    held = phase in ("Pending", "PreScheduling") and waiting is not None and not failed
    code, why = waiting if waiting is not None else ("", "")
    status["conditions"] = conditions(
        [
            ("Scheduled", placed, "MinMembersBound" if placed else "NotScheduled",
             f"{bound} of {gang.min_member} required members are bound"),
            ("Waiting", held, code or "Waiting" if held else "NotWaiting", why if held else ""),
            ("Preempting", bool(preempting), "EvictingLowerPriorityPods" if preempting else "NotPreempting",
             preempting),
            ("TimedOut", failed, "ScheduleTimeout" if failed else "WithinTimeout",
             "no placement for the whole gang within its timeout" if failed else ""),
        ],
        recorded.get("conditions") or [],
        now,
    )  # fmt: skip
    return status


def status_update(
    gang: Gang, state: GangState, failed: bool, start: float | None, recorded: JSON, now: float
) -> JSON | None:
    """The status to write for the gang as the lifecycle's `state` has it, or None when `recorded`
    already says all of it."""
    p = state.preempting
    status = podgroup_status(
        gang,
        0 if p is not None else len(state.plan),  # a preempting plan is not released yet
        failed,
        start,
        recorded,
        waiting=(state.wait_code, state.reason) if state.reason else None,
        preempting=f"{len(p.victims)} lower-priority pod(s) evicted for the gang" if p else "",
        now=now,
    )
    if {k: v for k, v in status.items() if v} == {k: v for k, v in recorded.items() if v}:
        return None
    return status


def conditions(wanted: list[tuple[str, bool, str, str]], recorded: list[JSON], now: float) -> list[JSON]:
    """metav1.Condition entries; a condition keeps its lastTransitionTime while its status holds."""
    before = {c.get("type"): c for c in recorded if isinstance(c, dict)}
    out = []
    for type_, true, reason, message in wanted:
        status = "True" if true else "False"
        old = before.get(type_) or {}
        since = old.get("lastTransitionTime") if old.get("status") == status else None
        out.append(
            {
                "type": type_,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": since or format_time(now),
            }
        )
    return out
