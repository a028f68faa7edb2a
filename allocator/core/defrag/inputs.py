"""What the defragmentation planner reads besides the cluster: the running pods' facts, the work
that waits, and the settings; and the one rule of who may move (`why_immovable`).

A pod may move for a waiter only when its replacement will come back on its own and moving it
breaks nothing: a strictly lower priority than the waiter's, a controller that recreates it
(ReplicaSet, StatefulSet, Job, ReplicationController; a bare pod only when the settings allow it;
a DaemonSet's pod never, it belongs to its node), not a member of a gang (moving one member would
split a running job), not protected by a PodDisruptionBudget that allows no disruption now, and
holding GPUs (moving a pod without GPUs frees no GPU room).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from allocator.core.gang.plan import GangPlanSettings
from allocator.core.request.pod_request import PodRequest

# Owners that recreate a pod elsewhere once it is evicted.
RECREATING = frozenset({"ReplicaSet", "StatefulSet", "Job", "ReplicationController"})
HOUR = 3600.0


@dataclass(frozen=True)
class PodFacts:
    """A running pod as the planner weighs it. `request` is what its replacement will ask (the
    pod's own request); `started` is on the same clock (seconds) as the planner's `now`."""

    key: str  # namespace/name
    node: str
    priority: int
    request: PodRequest
    gpus: int  # whole GPUs (distinct minors) it holds
    owner_kind: str = ""  # the controller's kind ("" for a bare pod)
    workload: str = ""  # the owner, as the caller names it (limits per workload)
    gang: str = ""  # the running gang it belongs to ("" for none)
    protected: bool = False  # a PodDisruptionBudget allows no disruption now
    started: float = 0.0
    uid: str = ""

    def gpu_hours(self, now: float) -> float:
        """The work a move throws away: the pod's age times its GPUs (it restarts elsewhere)."""
        return max(0.0, now - self.started) * self.gpus / HOUR


@dataclass(frozen=True)
class Waiter:
    """Work that does not fit: a gang's members, a large pod alone, or a Reservation's room (its
    template as one member). `names`: the nodes it may use (None: every node)."""

    name: str  # "gang ns/x", "pod ns/x", "reservation x": what a move says it unblocks
    members: tuple[PodRequest, ...]
    priority: int
    names: tuple[str, ...] | None = None


@dataclass(frozen=True)
class DefragPlanSettings:
    allow_bare: bool = False  # bare pods (no recreating owner) may move too
    proactive: bool = False  # with nothing waiting, free the cheapest node to raise the largest block
    proactive_priority: int = 0  # proactive moves take only pods of a priority below this one
    max_moves: int = 8  # per plan, all waiters together
    plan: GangPlanSettings = field(default_factory=GangPlanSettings)
    # The exact search (fewest pods, then GPU-hours) looks at this many subsets and places this
    # many; past it, the cheapest nodes are cleared and every move they do not need is put back.
    subsets: int = 5_000
    checks: int = 64


def why_immovable(pod: PodFacts, below: int, settings: DefragPlanSettings) -> str:
    """ "" when `pod` may move for work of priority `below`, else why not (for --explain)."""
    if pod.gpus <= 0:
        return "holds no GPU"
    if pod.priority >= below:
        return f"priority {pod.priority} is not below {below}"
    if pod.gang:
        return f"member of gang {pod.gang}"
    if pod.protected:
        return "a PodDisruptionBudget allows no disruption"
    if pod.owner_kind == "DaemonSet":
        return "a DaemonSet's pod"
    if pod.owner_kind not in RECREATING and not (settings.allow_bare and not pod.owner_kind):
        return f"owner {pod.owner_kind} does not recreate it" if pod.owner_kind else "a bare pod"
    return ""
