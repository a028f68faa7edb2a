"""A gang whose members use DRA claims, placed whole: every member's claims or none.

The gang is planned as extender gangs are (`core.gang.levels.plan_in_levels`: every member at once,
inside one domain of the gang's required or preferred topology level (rack, block, ... of the
topology profile) or of the topology keys, tightest GPU topology first), each member's request
being its claims' core request. Then each member's claims are solved on its planned node, one
member after another on private copies of the nodes (so members never share a device), with the
same bounds and constraint checks as a single pod (`solve`); a member the plan's node cannot serve
as its claims are written is solved on the other nodes in rank order (those of the plan's domain
only, for a required level). One member that fits nowhere and nothing is placed. Pure: the cluster
is not changed; the caller holds what it returns.

`pinned` is the other way round: a pod whose claims are allocated can only go to their node, which
a plan of the pod alone (the gang controller's, counting cpu and memory) must know.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from allocator.core.claims.place import NoPlacement
from allocator.core.claims.published import NodeDevices
from allocator.core.claims.solve import ClaimAnswer, solve
from allocator.core.cluster.state import ClusterState, affinity_matches, resources_fit
from allocator.core.gang.levels import Levels, plan_in_levels
from allocator.core.gang.plan import GangPlan, GangPlanSettings, fork_node
from allocator.core.node.state import NodeState
from allocator.core.reasons import Rejection
from allocator.core.request.claims import ClaimsRequest
from allocator.core.request.parse import with_signature
from allocator.core.request.pod_request import PodRequest, SelectorTerm
from allocator.core.request.usage import claim_usage_key
from allocator.core.scoring.scorer import NodeScorer
from apis.topology_profile import HOSTNAME


def place_gang(
    cluster: ClusterState,
    members: Sequence[ClaimsRequest],
    names: Sequence[str],
    published: Mapping[str, NodeDevices],
    scorer: NodeScorer,
    settings: GangPlanSettings,
    levels: Levels | None = None,
) -> list[ClaimAnswer] | NoPlacement:
    """One answer per member (in the order given), or why the gang cannot be placed whole."""
    plan = plan_in_levels(cluster, [m.pod for m in members], settings, levels, names=names)
    if not isinstance(plan, GangPlan):
        return NoPlacement({}, f"the gang does not fit whole: {plan.message}")
    if levels is not None and levels.required:
        names = _in_domain(cluster, names, plan, levels.top)
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


def _in_domain(cluster: ClusterState, names: Sequence[str], plan: GangPlan, key: str) -> list[str]:
    """The nodes of `names` in the plan's domain of level `key` (the value its nodes share)."""

    def value(name: str) -> str | None:
        return name if key == HOSTNAME else cluster.nodes[name].labels.get(key)

    values = {value(n) for n in plan.nodes}
    return [n for n in names if n in cluster.nodes and value(n) in values]


def pinned(req: PodRequest, node: str) -> PodRequest:
    """`req` held to `node` as well (a field term ANDed into each of its required terms), as
    kube-scheduler holds a pod to its allocated claims' node selector."""
    field = ("metadata.name", "In", (node,))
    terms = req.affinity_terms if req.affinity_terms is not None else (SelectorTerm(),)
    held = tuple(replace(t, fields=(*t.fields, field)) for t in terms)
    return with_signature(replace(req, affinity_terms=held))
