"""What the gang lifecycle step asks of the cluster, and the settings it follows.

`Planner` is the step's one door to the cluster: the inputs of a plan (the members' requests, the
nodes they may use, where their siblings are, the running pods preemption may weigh), the core's
decisions on the cluster state (`plan_gang`, `plan_with_preemption`, `min_resources_shortage`,
`whole_gpus_free`: CoreAdapter's), and the hold ledger's two changes, applied at once because the
plans made after them must see them (actions.py). The allocator implements it over its watch cache,
hold ledger and CoreAdapter (allocator/gang/planner.py); tests implement it with a fake.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Protocol

from allocator.core.gang.actions import HoldPlan, ReleaseHolds
from allocator.core.gang.levels import Levels
from allocator.core.gang.min_resources import Shortage
from allocator.core.gang.plan import GangPlan, NoPlan
from allocator.core.gang.preemption import PreemptionPlan
from allocator.core.gang.victims import Candidate
from allocator.core.gang.view import MemberPod
from allocator.core.request.pod_request import PodRequest
from apis.quantity import Quantity


class Planner(Protocol):
    # -- the inputs of a plan ------------------------------------------------------------------

    def requests(self, members: Sequence[MemberPod]) -> list[PodRequest]:
        """The parsed request of each member the cluster has in the version the member was seen
        in, in the members' order (one missing is left out: the cache has not caught up)."""
        ...

    def admitting_nodes(self, members: Sequence[MemberPod]) -> list[str]:
        """The nodes whose taints and cordon every one of the members tolerates."""
        ...

    def sibling_nodes(self, gang: str, members: Sequence[MemberPod]) -> dict[str, int]:
        """node -> how many siblings of the members (their gang, their job groups), the members
        themselves left out, hold or reserve room there."""
        ...

    def running(self) -> list[Candidate]:
        """The running pods preemption may weigh (bound, active, not deleting, not held)."""
        ...

    def still_holding(self, victims: Iterable[Candidate]) -> list[Candidate]:
        """Those of `victims` still there: the same pod, bound and active."""
        ...

    def pod_nodes(self, keys: Iterable[str]) -> dict[str, str]:
        """The node of each of these pods the cluster knows ("" while pending)."""
        ...

    # -- the core's decisions ------------------------------------------------------------------

    def plan_gang(
        self,
        requests: Sequence[PodRequest],
        *,
        siblings: Mapping[str, int],
        names: Iterable[str],
        levels: Levels | None = None,
    ) -> GangPlan | NoPlan: ...

    def plan_with_preemption(
        self,
        requests: Sequence[PodRequest],
        candidates: Iterable[Candidate],
        *,
        names: Iterable[str],
        siblings: Mapping[str, int],
        levels: Levels | None = None,
    ) -> PreemptionPlan | NoPlan: ...

    def min_resources_shortage(
        self, wanted: Mapping[str, Quantity], names: Iterable[str], removable: Collection[str]
    ) -> Shortage | None: ...

    def whole_gpus_free(self, names: Iterable[str]) -> int: ...

    # -- the hold ledger, at once ----------------------------------------------------------------

    def hold(self, plan: HoldPlan) -> bool:
        """Hold every placement, or none; False when one was refused."""
        ...

    def release(self, action: ReleaseHolds) -> None: ...


class LifecycleSettings(Protocol):
    """The part of the `gang:` settings the step follows (GangSettings fits)."""

    @property
    def bind_timeout(self) -> float: ...

    @property
    def preemption(self) -> bool: ...

    @property
    def preemption_timeout(self) -> float: ...

    @property
    def starvation_bound(self) -> float: ...
