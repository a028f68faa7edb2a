"""All-or-nothing placement of a gang on the simulated cluster (a stand-in until the gang
issue's planner exists; the simulator calls only `place_gang`).

Members are placed one after another through the policy and the core, as tentative assignments;
if any member fits nowhere, every tentative assignment is taken back, so a gang either runs whole
or holds nothing. Observers (the scorer's learned workload mix) hear of the members only once the
whole gang is placed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from simulator.cluster import SimCluster, SimRequest
from simulator.policies import Policy


@dataclass(frozen=True)
class Gang:
    name: str
    members: tuple[SimRequest, ...]

    @property
    def demand_pct(self) -> int:
        return sum(m.demand_pct for m in self.members)


def place_gang(cluster: SimCluster, members: Sequence[SimRequest], policy: Policy) -> bool:
    """Place every member or none; True when the gang was placed."""
    placed: list[SimRequest] = []
    for member in members:
        feasible = cluster.feasible(member)
        if not feasible.any():
            for done in reversed(placed):
                cluster.unassign(done)
            return False
        node, gpus = policy.select(cluster, member, feasible)
        policy.place(cluster, node, member, gpus, observe=False)
        placed.append(member)
    for member in placed:
        for observe in cluster.core.observers:
            observe(member.pod)
    return True
