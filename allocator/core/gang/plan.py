"""All-or-nothing placement of a gang: every member gets a node and its devices, or none does.

`plan_gang(cluster, members, settings, siblings=...)` returns a `GangPlan` or a `NoPlan` with the
reason. Pure and deterministic: it reads the cluster and never changes it. Members are tried on
private copies of the nodes they land on ("forks"), so a failed attempt leaves nothing behind; the
caller commits a plan by reserving its placements (the service) or assigning them (the simulator).

Among complete placements it prefers, in this order:
  1. the fewest nodes;
  2. the best GPU topology on the plan's worst node: the GPUs of the members sharing a node all in
     one NVLink domain, then behind one PCIe switch, one NUMA node, one socket (the topology
     score's tiers, `scoring.topology`);
  3. one topology domain for all nodes: they share the value of the first of `topology_keys`
     (rack before zone, as configured);
  4. nearness to siblings: members on nodes already hosting siblings (members placed earlier, pods
     of the same job group), then on nodes sharing a domain label with such a node;
  5. node names, so equal plans always come out the same.

Search: first-fit-decreasing. Members go largest first; the next node is the one whose capacity
best fits what is left (the smallest that holds all of it, else the largest), ties by nearness to
siblings, then topology, then name. It runs on every candidate node and again inside each topology
domain that could hold the gang on no more nodes than the best plan so far; the best complete
result wins. Capacities are upper bounds from node summaries (free whole GPUs, cpu, memory, pod
slots); placing a member runs the real `allocate`, so a plan holds exactly what bind would choose.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from allocator.core.cluster.state import ClusterState, affinity_matches, resources_fit
from allocator.core.devices.allocate import Allocation, allocate
from allocator.core.gang.siblings import domain_values, shared_domain
from allocator.core.node.gpu_summary import GPUSummary
from allocator.core.node.state import NodeState
from allocator.core.reasons import Rejection, plural
from allocator.core.request.pod_request import PodRequest
from allocator.core.scoring.device import DeviceScoring
from allocator.core.scoring.topology import NVLINK, best_tier, gpu_set_tier
from apis import resources as rn

AFFINITY = Rejection("NodeAffinity", "node(s) didn't match Pod's node affinity/selector", unresolvable=True)
REASONS_SHOWN = 3


@dataclass(frozen=True)
class GangPlanSettings:
    topology_keys: tuple[str, ...] = ()
    # The bind path's device scoring, so a plan picks the devices bind itself would pick.
    scoring: DeviceScoring | None = None
    # Per topology key, at most this many domains are tried (those with the most room first).
    max_domains: int = 32


@dataclass(frozen=True)
class Placement:
    key: str
    node: str
    allocation: Allocation


@dataclass(frozen=True)
class GangPlan:
    placements: tuple[Placement, ...]  # in the order the members were given
    tier: float  # GPU topology tier of the worst node (100 NVLink ... 0 across sockets)
    domain: str  # "key=value" every planned node shares; "" for none (or a single node)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(sorted({p.node for p in self.placements}))

    def node_of(self, key: str) -> str | None:
        return next((p.node for p in self.placements if p.key == key), None)


@dataclass(frozen=True)
class NoPlan:
    message: str
    placed: int = 0  # the most members that fitted at once
    unresolvable: bool = False  # some member fits on no node even with the cluster as it is


def plan_gang(
    cluster: ClusterState,
    members: Sequence[PodRequest],
    settings: GangPlanSettings | None = None,
    *,
    siblings: Mapping[str, int] | None = None,
    names: Iterable[str] | None = None,
) -> GangPlan | NoPlan:
    """A placement for every member at once (see the module docstring), among `names` (default:
    every node). `siblings`: node -> pods of the same gang or job group already there."""
    settings = settings or GangPlanSettings()
    siblings = {n: c for n, c in (siblings or {}).items() if c > 0}
    if not members:
        return GangPlan((), NVLINK, "")
    for m in members:
        if m.invalid is not None:
            return NoPlan(f"member {m.key}: {m.invalid.message}", 0, unresolvable=True)
    pool = list(cluster.nodes if names is None else names)
    candidates: dict[str, frozenset[str]] = {}
    by_shape: dict[tuple[object, ...], frozenset[str]] = {}
    for m in members:
        shape = _shape(m)
        if shape not in by_shape:
            found = _candidates(cluster, m, pool)
            if isinstance(found, NoPlan):
                return found
            by_shape[shape] = found
        candidates[m.key] = by_shape[shape]
    search = _Search(cluster, sorted(members, key=_largest_first), candidates, settings, siblings)
    return search.run(members)


# -- the search -----------------------------------------------------------------------------------


class _Attempt:
    """One greedy run: the node forks it made and where each member went."""

    def __init__(self, cluster: ClusterState) -> None:
        self.cluster = cluster
        self.forks: dict[str, NodeState] = {}
        self.placements: dict[str, Placement] = {}
        self.last_rejections: dict[str, Rejection] = {}

    def state(self, name: str) -> NodeState:
        fork = self.forks.get(name)
        return fork if fork is not None else self.cluster.nodes[name]

    def place(self, member: PodRequest, name: str, scoring: DeviceScoring | None) -> Rejection | None:
        state = self.state(name)
        refusal = _node_refusal(state, member)
        if refusal is not None:
            return refusal
        got = allocate(state, member, scoring=scoring)
        if isinstance(got, Rejection):
            return got
        fork = self.forks.get(name)
        if fork is None:
            fork = self.forks[name] = fork_node(state)
        fork.add_pod(
            member.key,
            got.devices,
            member.cpu_milli,
            member.memory,
            nonzero_cpu_milli=member.nonzero_cpu_milli,
            nonzero_memory=member.nonzero_memory,
        )
        self.placements[member.key] = Placement(member.key, name, got)
        return None


class _Search:
    def __init__(
        self,
        cluster: ClusterState,
        ordered: list[PodRequest],
        candidates: Mapping[str, frozenset[str]],
        settings: GangPlanSettings,
        siblings: Mapping[str, int],
    ) -> None:
        self.cluster = cluster
        self.ordered = ordered  # largest first
        self.candidates = candidates
        self.settings = settings
        self.siblings = siblings
        self.keys = settings.topology_keys
        pool = sorted(set().union(*candidates.values()))
        total = len(ordered)
        groups = _shape_groups(ordered, candidates)
        self.caps = {n: min(total, _capacity(cluster.nodes[n], groups)) for n in pool}
        self.pool = [n for n in pool if self.caps[n] > 0]
        # Each node's label value per topology key (None: no such label).
        self.values = {n: tuple(cluster.nodes[n].labels.get(k) for k in self.keys) for n in self.pool}
        self.in_domain: list[dict[str, list[str]]] = [{} for _ in self.keys]  # key -> value -> nodes
        for name, values in self.values.items():
            for i, value in enumerate(values):
                if value is not None:
                    self.in_domain[i].setdefault(value, []).append(name)
        self.shapes = {m.key: _shape(m) for m in ordered}
        self.sibling_domains = domain_values(cluster.nodes, siblings, self.keys)
        self.order = {n: self._order_key(n) for n in self.pool}

    def _order_key(self, name: str) -> tuple[object, ...]:
        """The static part of the order among nodes of equal capacity: nearness to siblings, the
        GPU topology the node could give its share of the gang, the name."""
        state = self.cluster.nodes[name]
        first = self.ordered[0]
        tier = NVLINK
        g = first.gpu
        if g is not None and not g.shared and state.inventory is not None:
            tier = best_tier(state.inventory, GPUSummary.of(state).whole_mask, self.caps[name] * g.count)
        return (-self._nearness(name), -tier, name)

    def _nearness(self, name: str) -> int:
        """How close to siblings: their node, else the narrowest domain shared with one of theirs."""
        if self.siblings.get(name):
            return len(self.keys) + 1
        return _joins(self.values[name], self.sibling_domains)

    def run(self, members: Sequence[PodRequest]) -> GangPlan | NoPlan:
        n = len(self.ordered)
        if sum(self.caps.values()) < n:
            return self._no_plan(self._greedy(self.pool))
        best: tuple[tuple[object, ...], _Attempt] | None = None
        most = self._greedy(self.pool)
        if len(most.placements) == n:
            best = (self._cost(most), most)
        for i, key in enumerate(self.keys):
            for nodes in self._domains(key):
                bound = _nodes_needed([self.caps[x] for x in nodes], n)
                if best is not None:
                    count, _, rank = best[0][:3]
                    if bound > count or (bound == count and rank <= i):  # type: ignore[operator]
                        continue
                attempt = self._greedy(nodes)
                if len(attempt.placements) > len(most.placements):
                    most = attempt
                if len(attempt.placements) == n:
                    cost = self._cost(attempt)
                    if best is None or cost < best[0]:
                        best = (cost, attempt)
        if best is None:
            return self._no_plan(most)
        attempt = best[1]
        states = [self.cluster.nodes[x] for x in sorted({p.node for p in attempt.placements.values()})]
        _, domain = shared_domain(states, self.keys) if len(states) > 1 else (0, "")
        return GangPlan(
            tuple(attempt.placements[m.key] for m in members),
            -best[0][1],
            domain,  # type: ignore[operator]
        )

    def _domains(self, key: str) -> list[list[str]]:
        groups: dict[str, list[str]] = {}
        i = self.keys.index(key)
        for name in self.pool:
            value = self.values[name][i]
            if value is not None:
                groups.setdefault(value, []).append(name)
        n = len(self.ordered)
        roomy = [(v, g) for v, g in groups.items() if sum(self.caps[x] for x in g) >= n]
        roomy.sort(key=lambda vg: (-sum(self.caps[x] for x in vg[1]), vg[0]))
        return [g for _, g in roomy[: self.settings.max_domains]]

    def _greedy(self, nodes: Sequence[str]) -> _Attempt:
        attempt = _Attempt(self.cluster)
        remaining = list(self.ordered)
        unused = list(nodes)
        unused_set = set(unused)
        scoring = self.settings.scoring
        picked: list[set[str]] = [set() for _ in self.keys]  # domains of the nodes taken so far
        caps = self.caps
        while remaining and unused:
            left = len(remaining)
            # The capacity class to take from: the smallest that holds every member left, else
            # the largest; the order within it decides among its nodes.
            room = [caps[x] for x in unused]
            enough = [c for c in room if c >= left]
            target = min(enough) if enough else max(room)
            tied = [x for x in unused if caps[x] == target]
            pick = min(tied, key=self.order.__getitem__)
            if any(picked):
                # Only nodes in a domain of those taken can beat the static order.
                near = {pick} | {
                    x
                    for i, values in enumerate(picked)
                    for v in values
                    for x in self.in_domain[i].get(v, ())
                    if caps[x] == target and x in unused_set
                }
                pick = min(near, key=lambda x: self._tie(x, picked))
            unused.remove(pick)
            unused_set.discard(pick)
            for i, value in enumerate(self.values[pick]):
                if value is not None:
                    picked[i].add(value)
            failed: set[tuple[object, ...]] = set()
            for m in list(remaining):
                if pick not in self.candidates[m.key]:
                    continue
                shape = self.shapes[m.key]
                if shape in failed:
                    continue
                refusal = attempt.place(m, pick, scoring)
                if refusal is None:
                    remaining.remove(m)
                else:
                    failed.add(shape)
                    attempt.last_rejections[m.key] = refusal
        return attempt

    def _tie(self, name: str, picked: list[set[str]]) -> tuple[object, ...]:
        """Among nodes of equal capacity: near siblings, then in a domain of the nodes already
        taken (narrowest key first), then the static order (topology, name)."""
        near, *rest = self.order[name]
        return (near, -_joins(self.values[name], picked), *rest)

    def _cost(self, attempt: _Attempt) -> tuple[object, ...]:
        on_node: dict[str, int] = {}
        for p in attempt.placements.values():
            on_node[p.node] = on_node.get(p.node, 0) | _gpu_mask(p.allocation)
        tier = NVLINK
        for name, mask in on_node.items():
            inv = self.cluster.nodes[name].inventory
            if mask and inv is not None:
                tier = min(tier, gpu_set_tier(inv, mask))
        states = [self.cluster.nodes[x] for x in sorted(on_node)]
        rank, _ = shared_domain(states, self.keys)
        near = sum(self._nearness(p.node) for p in attempt.placements.values())
        return (len(on_node), -tier, rank, -near, tuple(sorted(on_node)))

    def _no_plan(self, most: _Attempt) -> NoPlan:
        n = len(self.ordered)
        placed = len(most.placements)
        first = next(m for m in self.ordered if m.key not in most.placements)
        counts: Counter[str] = Counter()
        for name in sorted(self.candidates[first.key]):
            state = most.state(name)
            refusal = _node_refusal(state, first) or _fits(state, first)
            counts[refusal.message if refusal is not None else "room taken by other members"] += 1
        top = "; ".join(f"{c} {msg}" for msg, c in counts.most_common(REASONS_SHOWN))
        more = len(counts) - REASONS_SHOWN
        where = f" ({top}{f'; and {more} other reasons' if more > 0 else ''})" if top else ""
        return NoPlan(
            f"only {placed} of {plural(n, 'member')} fit at once; member {first.key} has no room{where}",
            placed,
        )


# -- helpers --------------------------------------------------------------------------------------


def fork_node(state: NodeState) -> NodeState:
    """A private copy of a node: same inventory (immutable, shared), labels, allocatable and pods."""
    fork = NodeState(state.name, state.inventory, state.labels, state.allocatable)
    for entry in state.pods.values():
        fork.add_usage(entry)
    return fork


def _shape(m: PodRequest) -> tuple[object, ...]:
    """Members with equal shapes fit on exactly the same nodes."""
    return (m.signature, tuple(sorted(m.node_selector.items())), m.affinity_terms)


def _gpus_of(m: PodRequest) -> int:
    g = m.gpu
    if g is None:
        return 0
    return g.count * 100 if not g.shared else max(v for _, v in g.per_gpu) if g.per_gpu else 0


def _largest_first(m: PodRequest) -> tuple[object, ...]:
    return (-_gpus_of(m), -len(m.devices), -m.cpu_milli, -m.memory, m.key)


def _node_refusal(state: NodeState, m: PodRequest) -> Rejection | None:
    if not affinity_matches(state, m):
        return AFFINITY
    return resources_fit(state, m)


def _fits(state: NodeState, m: PodRequest) -> Rejection | None:
    got = allocate(state, m)
    return got if isinstance(got, Rejection) else None


def _candidates(cluster: ClusterState, m: PodRequest, pool: list[str]) -> frozenset[str] | NoPlan:
    """Nodes that could host the member now (devices, cpu/memory/pods, node affinity)."""
    passed, failed = cluster.feasible(m, pool)
    reasons: dict[str, Rejection] = dict(failed)
    ok = []
    for name in passed:
        refusal = _node_refusal(cluster.nodes[name], m)
        if refusal is None:
            ok.append(name)
        else:
            reasons[name] = refusal
    if ok:
        return frozenset(ok)
    counts = Counter(r.message for r in reasons.values())
    top = "; ".join(f"{c} {msg}" for msg, c in counts.most_common(REASONS_SHOWN))
    unresolvable = bool(reasons) and all(r.unresolvable for r in reasons.values())
    return NoPlan(
        f"member {m.key} fits on none of {plural(len(pool), 'node')}" + (f": {top}" if top else ""),
        0,
        unresolvable=unresolvable or not pool,
    )


@dataclass(frozen=True)
class _Group:
    """Members with the same capacity needs and candidate nodes."""

    gpus: int  # whole GPUs each (shared-GPU and other devices: left to the allocator)
    cpu_milli: int
    memory: int
    nodes: frozenset[str]
    count: int


def _shape_groups(ordered: Sequence[PodRequest], candidates: Mapping[str, frozenset[str]]) -> list[_Group]:
    """The members grouped by need, smallest first."""
    counts: Counter[tuple[int, int, int, frozenset[str]]] = Counter()
    for m in ordered:
        gpus = m.gpu.count if m.gpu is not None and not m.gpu.shared else 0
        counts[(gpus, m.cpu_milli, m.memory, candidates[m.key])] += 1
    return [_Group(*need, count) for need, count in sorted(counts.items(), key=lambda kv: kv[0][:3])]


def _capacity(state: NodeState, groups: Sequence[_Group]) -> int:
    """An upper bound on how many members the node can take together: members smallest first,
    counted against free whole GPUs, cpu, memory and pod slots."""
    gpus = GPUSummary.of(state).whole_free
    cpu = state.cpu_free_milli
    memory = state.memory_free
    alloc = state.allocatable
    pods = alloc[rn.PODS] - state.pod_count if rn.PODS in alloc else sum(g.count for g in groups)
    count = 0
    for g in groups:
        if state.name not in g.nodes:
            continue
        take = min(
            g.count,
            pods,
            gpus // g.gpus if g.gpus else g.count,
            cpu // g.cpu_milli if g.cpu_milli else g.count,
            memory // g.memory if g.memory else g.count,
        )
        if take <= 0:
            continue
        gpus -= take * g.gpus
        cpu -= take * g.cpu_milli
        memory -= take * g.memory
        pods -= take
        count += take
    return count


def _joins(values: Sequence[str | None], domains: Sequence[set[str]]) -> int:
    """len(values) - i for the first key i whose value is among `domains[i]`, else 0."""
    for i, value in enumerate(values):
        if value is not None and value in domains[i]:
            return len(values) - i
    return 0


def _nodes_needed(caps: list[int], members: int) -> int:
    """The fewest of these capacities that add up to `members` (a lower bound on a plan's nodes)."""
    total = 0
    for i, cap in enumerate(sorted(caps, reverse=True), start=1):
        total += cap
        if total >= members:
            return i
    return len(caps) + 1


def _gpu_mask(allocation: Allocation) -> int:
    mask = 0
    for minor in allocation.minors(rn.DeviceType.GPU):
        mask |= 1 << minor
    return mask
