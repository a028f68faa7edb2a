"""A gang whose members use DRA claims, placed whole: every member's claims or none.

The gang is planned as extender gangs are (`core.gang.plan.plan_gang`: every member at once, inside
one topology domain when it can, tightest GPU topology first), each member's request being its
claims' core request. Then each member's claims are solved on its planned node, one member after
another on private copies of the nodes (so members never share a device), with the same bounds and
constraint checks as a single pod (`solve`); a member the plan's node cannot serve as its claims
are written is solved on the other nodes in rank order. One member that fits nowhere and nothing
is placed. Pure: the cluster is not changed; the caller holds what it returns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from allocator.core.claims.place import NoPlacement
from allocator.core.claims.published import NodeDevices
from allocator.core.claims.solve import ClaimAnswer, solve
from allocator.core.cluster.state import ClusterState, affinity_matches, resources_fit
from allocator.core.gang.plan import GangPlan, GangPlanSettings, fork_node, plan_gang
from allocator.core.node.state import NodeState
from allocator.core.reasons import Rejection
from allocator.core.request.claims import ClaimsRequest
from allocator.core.request.usage import claim_usage_key
from allocator.core.scoring.scorer import NodeScorer


def place_gang(
    cluster: ClusterState,
    members: Sequence[ClaimsRequest],
    names: Sequence[str],
    published: Mapping[str, NodeDevices],
    scorer: NodeScorer,
    settings: GangPlanSettings,
) -> list[ClaimAnswer] | NoPlacement:
    """One answer per member (in the order given), or why the gang cannot be placed whole."""
    plan = plan_gang(cluster, [m.pod for m in members], settings, names=names)
    if not isinstance(plan, GangPlan):
        return NoPlacement({}, f"the gang does not fit whole: {plan.message}")
    forks: dict[str, NodeState] = {}

    def state(name: str) -> NodeState:
        if name not in forks:
            forks[name] = fork_node(cluster.nodes[name])
        return forks[name]

    answers = []
    for member in members:
        planned = plan.node_of(member.pod.key)
        order = [planned] if planned else []
        order += [n for n in cluster.rank(member.pod, names, scorer) if n != planned]
        got: ClaimAnswer | Rejection | None = None
        for name in order:
            node = state(name)
            if not affinity_matches(node, member.pod) or resources_fit(node, member.pod) is not None:
                continue
            got = solve(node, member, published.get(name), scoring=settings.scoring)
            if isinstance(got, ClaimAnswer):
                break
        if not isinstance(got, ClaimAnswer):
            why = got.message if isinstance(got, Rejection) else "no node admits it"
            return NoPlacement({}, f"member {member.pod.key} fits nowhere beside the others: {why}")
        node = forks[got.node]
        for claim, usage in got.usage.items():
            node.add_pod(claim_usage_key(claim), usage)
        node.add_pod(
            member.pod.key,
            None,
            member.pod.cpu_milli,
            member.pod.memory,
            nonzero_cpu_milli=member.pod.nonzero_cpu_milli,
            nonzero_memory=member.pod.nonzero_memory,
        )
        answers.append(got)
    return answers
