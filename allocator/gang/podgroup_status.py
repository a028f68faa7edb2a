"""A PodGroup's status as the gang controller computes it from its members (the phases of the
scheduler-plugins coscheduling API: Pending, PreScheduling, Scheduling, Scheduled, Running,
Finished, Failed)."""

from __future__ import annotations

from typing import Any

from allocator.gang.controller_state import Gang
from allocator.gang.timefmt import format_time

JSON = dict[str, Any]


def podgroup_status(gang: Gang, planned: int, failed: bool, start: float | None, recorded: JSON) -> JSON:
    """The status to write: `planned` members hold a plan, `failed` says the gang timed out,
    `start` is when it first had its minimum, `recorded` the status written last."""
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
    return status
