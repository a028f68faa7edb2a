"""All-or-nothing placement of a gang on the simulated cluster for the trace replays (`place_gang`;
`topoalloc priority-mix` uses the core's topology-aware `plan_gang` instead), and `place_pod`, the
step every lone pod and every member takes.

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


def place_pod(cluster: SimCluster, req: SimRequest, policy: Policy, *, observe: bool = True) -> bool:
    """Place one pod on the node the policy selects among the feasible ones; False when none is."""
    feasible = cluster.feasible(req)
    if not feasible.any():
        return False
    node, gpus = policy.select(cluster, req, feasible)
    policy.place(cluster, node, req, gpus, observe=observe)
    return True


def place_gang(cluster: SimCluster, members: Sequence[SimRequest], policy: Policy) -> bool:
    """Place every member or none; True when the gang was placed."""
    placed: list[SimRequest] = []
    for member in members:
        if not place_pod(cluster, member, policy, observe=False):
            for done in reversed(placed):
                cluster.unassign(done)
            return False
        placed.append(member)
    for member in placed:
        for observe in cluster.core.observers:
            observe(member.pod)
    return True
