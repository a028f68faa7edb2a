"""Gangs in the trace replays: a gang's members arrive together and are placed all-or-nothing by
`SimCluster.place` (`topoalloc priority-mix` uses the core's topology-aware `plan_gang` instead).

Members are placed one after another through the policy and the core, as tentative assignments;
if any member fits nowhere, every tentative assignment is taken back, so a gang either runs whole
or holds nothing. Observers (the scorer's learned workload mix) hear of the members only once the
whole gang is placed.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.cluster import SimRequest


@dataclass(frozen=True)
class Gang:
    name: str
    members: tuple[SimRequest, ...]

    @property
    def demand_pct(self) -> int:
        return sum(m.demand_pct for m in self.members)


def members_of(item: SimRequest | Gang) -> tuple[SimRequest, ...]:
    """The pods an arrival places together: a gang's members, or the lone pod."""
    return item.members if isinstance(item, Gang) else (item,)
