"""Device-aware preemption: which lower-priority pods to remove so that a pod, or a whole gang, fits.

Room is never estimated from counts: a victim set qualifies only when the real device choice
(`allocate`, and `plan_gang` for a gang) succeeds on a private copy of the node(s) with the
victims taken out. So freeing 8 GPUs spread over two NVLink domains does not count for a pod that
needs 8 GPUs in one domain, nor GPUs whose PCIe switch has no free NIC for a joint GPU+RDMA pod.

* `node_victims(state, req, candidates)`: for one node (the extender's `preempt` verb), the
  cheapest set of eligible pods on it whose removal lets the pod fit there, or None when no set
  does. A member of a running gang is eligible only when its whole gang runs on this node (a
  node's answer can only name pods on that node).
* `plan_with_preemption(cluster, members, candidates, ...)`: for a waiting gang, a placement of
  every member at once plus the cheapest cluster-wide victims that make room for it (a running
  gang only as a whole, wherever its members are). Room the members themselves hold (a gang that
  re-plans its preemption) is not in their way.

Eligibility and cost are `victims.units_of` and `victims.cost`: only pods of a strictly lower
priority; fewest PodDisruptionBudget violations first (protected pods are the last resort), then
fewest pods, then priority, then GPUs.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from allocator.core.cluster.state import ClusterState, resources_fit
from allocator.core.devices.allocate import Allocation, allocate
from allocator.core.gang.plan import GangPlan, GangPlanSettings, NoPlan, fork_node, plan_gang
from allocator.core.gang.priority import gang_priority
from allocator.core.gang.victims import (
    Budget,
    Candidate,
    Choice,
    Unit,
    calm_spare,
    cheapest,
    last_resort,
    least_violating,
    protected,
    units_of,
)
from allocator.core.node.gpu_summary import GPUSummary
from allocator.core.node.state import NodeState, PodEntry
from allocator.core.request.pod_request import PodRequest
from allocator.core.scoring.device import DeviceScoring
from apis import resources as rn


@dataclass(frozen=True)
class NodeVictims:
    node: str
    victims: tuple[Candidate, ...]
    allocation: Allocation  # what the pod would get once they are gone
    exact: bool  # the cheapest set (False: inclusion-minimal, the search budget ran out)


@dataclass(frozen=True)
class PreemptionPlan:
    plan: GangPlan
    victims: tuple[Candidate, ...]  # () when the gang fits without preemption
    exact: bool

    @property
    def victim_nodes(self) -> tuple[str, ...]:
        return tuple(sorted({v.node for v in self.victims}))


def gpus_held(state: NodeState | None, key: str) -> int:
    """GPUs (distinct minors) a pod holds on the node, shares included."""
    entry = state.pods.get(key) if state is not None else None
    if entry is None:
        return 0
    return len({minor for dtype, minor, _ in entry.used if dtype == rn.DeviceType.GPU})


def whole_gpus_wanted(req: PodRequest) -> int:
    g = req.gpu
    return g.count if g is not None and not g.shared else 0


# -- one node ------------------------------------------------------------------------------------


def node_victims(
    state: NodeState,
    req: PodRequest,
    candidates: Iterable[Candidate],
    *,
    scoring: DeviceScoring | None = None,
    budget: Budget | None = None,
) -> NodeVictims | None:
    """The cheapest eligible victims on this node that let `req` fit here (see the module)."""
    if req.invalid is not None:
        return None
    scratch = fork_node(state)
    units = [
        u
        for u in units_of(candidates, req.priority, lambda c: gpus_held(state, c.key))
        if all(p.node == state.name and p.key in state.pods for p in u.pods)
    ]

    def fits(removed: Sequence[Unit]) -> bool:
        with _without(scratch, [k for u in removed for k in u.keys]):
            return _place(scratch, req, scoring) is not None

    shortfall = max(0, whole_gpus_wanted(req) - GPUSummary.of(state).whole_free)
    choice = cheapest(units, fits, shortfall=shortfall, budget=budget)
    if choice is None:
        return None
    with _without(scratch, [p.key for p in choice.victims]):
        got = _place(scratch, req, scoring)
    assert got is not None  # `cheapest` checked exactly this
    return NodeVictims(state.name, choice.victims, got, choice.exact)


def _place(state: NodeState, req: PodRequest, scoring: DeviceScoring | None) -> Allocation | None:
    if resources_fit(state, req) is not None:
        return None
    got = allocate(state, req, scoring=scoring)
    return got if isinstance(got, Allocation) else None


# -- a gang, cluster-wide --------------------------------------------------------------------------


def plan_with_preemption(
    cluster: ClusterState,
    members: Sequence[PodRequest],
    candidates: Iterable[Candidate],
    settings: GangPlanSettings | None = None,
    *,
    names: Iterable[str] | None = None,
    siblings: Mapping[str, int] | None = None,
    budget: Budget | None = None,
) -> PreemptionPlan | NoPlan:
    """A placement for every member at once and the cheapest victims that make room for it; a
    NoPlan when not even removing every eligible pod makes room. Pure: `cluster` is not changed."""
    pool = sorted(cluster.nodes if names is None else (n for n in names if n in cluster.nodes))
    own = {m.key for m in members}
    scratch = _scratch(cluster, pool, own)
    direct = plan_gang(scratch, members, settings, siblings=siblings, names=pool)
    if isinstance(direct, GangPlan):
        return PreemptionPlan(direct, (), True)
    below = gang_priority(m.priority for m in members)
    candidates = [c for c in candidates if c.key not in own]
    units = units_of(candidates, below, lambda c: gpus_held(scratch.nodes.get(c.node), c.key))
    units = [u for u in units if any(p.node in scratch.nodes for p in u.pods)]
    if not units:
        return direct

    def plan(removed: Sequence[Unit], where: Sequence[str] = pool) -> GangPlan | NoPlan:
        with _cluster_without(scratch, [p for u in removed for p in u.pods]):
            return plan_gang(scratch, members, settings, siblings=siblings, names=where)

    def fits(removed: Sequence[Unit]) -> bool:
        return isinstance(plan(removed), GangPlan)

    wanted = sum(whole_gpus_wanted(m) for m in members)
    shortfall = max(0, wanted - sum(GPUSummary.of(scratch.nodes[n]).whole_free for n in pool))
    everything = plan(units)
    if isinstance(everything, NoPlan):
        return NoPlan(
            f"no room even after preempting every lower-priority pod: {everything.message}",
            everything.placed,
            everything.unresolvable,
        )
    choice, at = least_violating(units, fits, shortfall=shortfall, budget=budget)
    where: Sequence[str] = pool
    if choice is None:
        # Over budget: settle for an inclusion-minimal set inside the nodes of a placement found
        # with all the candidates gone (so its topology and domain are kept): of the unprotected
        # ones if they may suffice, else protected pods last.
        choice, where = _fallback(units, plan, everything, pool, calm_first=at == 0)
    final = plan(choice.units, where)
    assert isinstance(final, GangPlan)  # the search checked exactly this
    return PreemptionPlan(final, choice.victims, choice.exact)


def _fallback(
    units: list[Unit],
    plan: Callable[[Sequence[Unit], Sequence[str]], GangPlan | NoPlan],
    everything: GangPlan,
    pool: Sequence[str],
    *,
    calm_first: bool,
) -> tuple[Choice, Sequence[str]]:
    def inside(nodes: Sequence[str]) -> tuple[list[Unit], Callable[[Sequence[Unit]], bool]]:
        touching = [u for u in units if any(p.node in nodes for p in u.pods)]
        return touching, lambda r: isinstance(plan(r, nodes), GangPlan)

    if calm_first:  # the budget ran out before any set that breaks a budget was weighed
        calm = [u for u in units if not protected(u)]
        calm_plan = plan(calm, pool)
        if calm and isinstance(calm_plan, GangPlan):
            touching, fits = inside(calm_plan.nodes)
            found = calm_spare(touching, fits)
            if found is not None:
                return found, calm_plan.nodes
    touching, fits = inside(everything.nodes)
    return last_resort(touching, fits), everything.nodes


def _scratch(cluster: ClusterState, pool: Sequence[str], own: Collection[str] = ()) -> ClusterState:
    """A private cluster of copies of the pooled nodes, for trying removals; what the keys in
    `own` hold (the members' own holds) is left out."""
    out = ClusterState(cluster.tie_seed)
    for name in pool:
        fork = out.nodes[name] = fork_node(cluster.nodes[name])
        for key in [k for k in fork.pods if k in own]:
            fork.remove_pod(key)
        out.table.attach(fork)
        for key in fork.pods:
            out.pod_node[key] = name
    return out


@contextmanager
def _without(state: NodeState, keys: Iterable[str]) -> Iterator[None]:
    """The node with these pods taken out, put back on exit."""
    gone: list[PodEntry] = []
    for key in keys:
        entry = state.pods.get(key)
        if entry is not None:
            gone.append(entry)
            state.remove_pod(key)
    try:
        yield
    finally:
        for entry in gone:
            state.add_usage(entry)


@contextmanager
def _cluster_without(cluster: ClusterState, pods: Iterable[Candidate]) -> Iterator[None]:
    by_node: dict[str, list[str]] = {}
    for p in pods:
        if p.node in cluster.nodes:
            by_node.setdefault(p.node, []).append(p.key)
    with ExitStack() as stack:
        for name, keys in sorted(by_node.items()):
            stack.enter_context(_without(cluster.nodes[name], keys))
        yield
