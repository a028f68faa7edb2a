"""Topology levels for a gang (and an RL job group): keep every member inside one domain of a level.

A `Levels` is what a gang's wish (apis/topology_constraint.py) means in the allocator's topology
profile (apis/topology_profile.py): the levels the search may use, narrowest first, and whether
the widest of them is *required* (one domain of it, or no placement) or only *preferred*.

`plan_in_levels` wraps `plan_gang` (plan.py):

1. one node, when one node holds the whole gang (every domain contains it);
2. else, level by level from the narrowest: the domains of that level that could hold the gang
   (enough free whole GPUs), the siblings' domain first, then the tightest (fewest free GPUs, so
   the roomy domains stay whole for bigger gangs), then by value; the first domain where
   `plan_gang` places every member wins, the plan searching inside it with the narrower levels as
   its topology keys;
3. nothing at the widest allowed level: *required* waits, saying the level and the domains tried;
   *preferred* takes the fewest domains of the widest level (the roomiest first) that hold the
   gang, or the placement `plan_gang` finds without levels where that spans fewer domains (counted
   widest level first), so a preferred level never spreads a gang wider than no level would.

A required level also bounds where members go at all: only nodes carrying its label, and once
siblings (bound members, pods of the same job group) are placed, only their domain. Preemption
(`preempt_in_levels`) looks for victims inside one domain of a required level, the domains with
the most free and evictable GPUs first, and keeps the cheapest victims; for a preferred level it
runs cluster-wide with the profile's levels as topology keys. `keep_to_level` is the same bound
for pods of a job group placed one by one (the extender's filter). Pure; reads the cluster only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from allocator.core.cluster.state import ClusterState
from allocator.core.gang.plan import GangPlan, GangPlanSettings, NoPlan, plan_gang
from allocator.core.gang.preemption import PreemptionPlan, gpus_held, plan_with_preemption, whole_gpus_wanted
from allocator.core.gang.victims import Budget, Candidate
from allocator.core.node.gpu_summary import GPUSummary
from allocator.core.node.state import NodeState
from allocator.core.reasons import Rejection, plural
from allocator.core.request.pod_request import PodRequest
from apis.topology_constraint import TopologyWish
from apis.topology_profile import HOSTNAME, TopologyProfile

SHOWN = 3  # domains named in a "why waiting" message
PREEMPT_DOMAINS = 4  # domains of a required level searched for victims
OFF_LEVEL = "TopologyLevel"


@dataclass(frozen=True)
class Levels:
    keys: tuple[str, ...]  # the levels the search may use, narrowest first
    names: tuple[str, ...]  # what they are called (leaf, rack...), for messages
    required: bool  # one domain of keys[-1], or no placement
    source: str = ""  # where the wish was read

    @property
    def top(self) -> str:
        return self.keys[-1]

    @property
    def what(self) -> str:
        """`required rack (topoalloc.io/rack)`, as the messages name it."""
        mode = "required" if self.required else "preferred"
        name, key = self.names[-1], self.keys[-1]
        return f"{mode} {name} ({key})" if name != key else f"{mode} {key}"


def levels_of(profile: TopologyProfile, wish: TopologyWish | None) -> Levels | None:
    """The levels a wish means in a profile. A key the profile does not list is a level of its own;
    a preferred level searches every level of the profile (a narrower domain is only closer)."""
    if wish is None or not wish.level:
        return None
    key = profile.key_of(wish.level)
    if key == HOSTNAME:
        return Levels((HOSTNAME,), ("node",), bool(wish.required), wish.source)
    i = profile.index(key)
    if i is None:
        return Levels((key,), (key,), bool(wish.required), wish.source)
    last = i + 1 if wish.required else len(profile.levels)
    levels = profile.levels[:last]
    return Levels(
        tuple(lv.key for lv in levels), tuple(lv.name for lv in levels), bool(wish.required), wish.source
    )


def plan_in_levels(
    cluster: ClusterState,
    members: Sequence[PodRequest],
    settings: GangPlanSettings | None = None,
    levels: Levels | None = None,
    *,
    siblings: Mapping[str, int] | None = None,
    names: Iterable[str] | None = None,
) -> GangPlan | NoPlan:
    """A placement of every member that keeps to `levels` (see the module); `plan_gang` without."""
    settings = settings or GangPlanSettings()
    if levels is None:
        return plan_gang(cluster, members, settings, siblings=siblings, names=names)
    siblings = {n: c for n, c in (siblings or {}).items() if c > 0}
    pool = _pool(cluster, names, levels, siblings)
    if isinstance(pool, NoPlan):
        return pool
    inner = replace(settings, topology_keys=levels.keys)
    direct = plan_gang(cluster, members, inner, siblings=siblings, names=pool)
    if isinstance(direct, NoPlan):
        what = f"{levels.what}: " if levels.required else ""
        return replace(direct, message=what + direct.message)
    if len(direct.nodes) <= 1:
        return direct
    wanted = sum(whole_gpus_wanted(m) for m in members)
    tried: list[tuple[str, str]] = []  # (domain, why not) at the widest level
    placed = 0
    for i, key in enumerate(levels.keys):
        domains, short = _domains(cluster, pool, key, wanted, siblings)
        sub = replace(settings, topology_keys=levels.keys[:i])
        for value, nodes in domains[: settings.max_domains]:
            found = plan_gang(cluster, members, sub, siblings=siblings, names=nodes)
            if isinstance(found, GangPlan):
                return replace(found, domain=f"{key}={value}")
            if key == levels.top:
                tried.append((value, found.message))
                placed = max(placed, found.placed)
        if key == levels.top:
            tried += [(v, f"{free} of {wanted} GPUs free") for v, free in short]
    if levels.required:
        return NoPlan(_waiting(levels, len(members), tried), placed)
    fewest = _fewest_domains(cluster, members, inner, levels.top, pool, wanted, siblings)
    if fewest is None:
        return direct
    # The roomiest domains may be fragmented: keep whichever spans fewer domains, widest level first.
    return min((fewest, direct), key=lambda p: _spans(cluster, p, levels.keys))


def preempt_in_levels(
    cluster: ClusterState,
    members: Sequence[PodRequest],
    candidates: Iterable[Candidate],
    settings: GangPlanSettings | None = None,
    levels: Levels | None = None,
    *,
    names: Iterable[str] | None = None,
    siblings: Mapping[str, int] | None = None,
    budget: Budget | None = None,
) -> PreemptionPlan | NoPlan:
    """`plan_with_preemption` keeping to the levels: for a required level, the cheapest victims
    inside one of its domains (the roomiest `PREEMPT_DOMAINS`, counting what lower-priority pods
    hold); otherwise cluster-wide, the profile's levels as the topology keys."""
    settings = settings or GangPlanSettings()
    candidates = list(candidates)
    if levels is None or not levels.required:
        inner = settings if levels is None else replace(settings, topology_keys=levels.keys)
        return plan_with_preemption(
            cluster, members, candidates, inner, names=names, siblings=siblings, budget=budget
        )
    siblings = {n: c for n, c in (siblings or {}).items() if c > 0}
    pool = _pool(cluster, names, levels, siblings)
    if isinstance(pool, NoPlan):
        return pool
    below = min((m.priority for m in members), default=0)
    freeable: Counter[str] = Counter()
    for c in candidates:
        if c.priority < below:
            freeable[c.node] += gpus_held(cluster.nodes.get(c.node), c.key)
    groups = _groups(cluster, pool, levels.top)
    room = {v: sum(_free(cluster.nodes[n]) + freeable[n] for n in g) for v, g in groups.items()}
    order = sorted(groups, key=lambda v: (-room[v], v))[:PREEMPT_DOMAINS]
    inner = replace(settings, topology_keys=levels.keys[:-1])
    best: tuple[tuple[object, ...], PreemptionPlan] | None = None
    last: NoPlan | None = None
    for value in order:
        found = plan_with_preemption(
            cluster, members, candidates, inner, names=groups[value], siblings=siblings, budget=budget
        )
        if isinstance(found, NoPlan):
            last = found
            continue
        found = replace(found, plan=replace(found.plan, domain=f"{levels.top}={value}"))
        v = found.victims
        rank = (len(v), max((c.priority for c in v), default=0), sum(c.priority for c in v), value)
        if best is None or rank < best[0]:
            best = (rank, found)
    if best is not None:
        return best[1]
    why = f": {last.message}" if last is not None else ""
    return NoPlan(f"{levels.what}: no room in any of its domains even after preempting{why}")


def keep_to_level(
    nodes: Mapping[str, NodeState], names: Sequence[str], siblings: Mapping[str, int], key: str, group: str
) -> tuple[list[str], dict[str, Rejection]]:
    """For a pod of a job group placed on its own with a required level: only nodes carrying the
    level's label, and once siblings are placed only their domain (the one holding most of them)."""
    anchor = _anchor(nodes, siblings, key)
    passed: list[str] = []
    refused: dict[str, Rejection] = {}
    off = Rejection(
        OFF_LEVEL,
        f"{group} keeps to {key}={anchor}" if anchor else f"{group} needs the node label {key}",
    )
    for name in names:
        state = nodes.get(name)
        value = _value(state, key) if state is not None else None
        if value is not None and (anchor is None or value == anchor):
            passed.append(name)
        else:
            refused[name] = off
    return passed, refused


# -- helpers --------------------------------------------------------------------------------------


def _pool(
    cluster: ClusterState, names: Iterable[str] | None, levels: Levels, siblings: Mapping[str, int]
) -> list[str] | NoPlan:
    """The nodes a plan may use: for a required level, those carrying its label, and only the
    siblings' domain once they are placed."""
    pool = [n for n in (cluster.nodes if names is None else names) if n in cluster.nodes]
    if not levels.required:
        return pool
    top = levels.top
    labelled = [n for n in pool if _value(cluster.nodes[n], top) is not None]
    anchor = _anchor(cluster.nodes, siblings, top)
    if anchor is not None:
        labelled = [n for n in labelled if _value(cluster.nodes[n], top) == anchor]
        if not labelled:
            return NoPlan(f"{levels.what}: no node of the siblings' {top}={anchor} may be used")
    if not labelled:
        return NoPlan(f"{levels.what}: none of {plural(len(pool), 'node')} carries the label {top}")
    return labelled


def _anchor(nodes: Mapping[str, NodeState], siblings: Mapping[str, int], key: str) -> str | None:
    """The domain of `key` holding the most siblings (by value on a tie), None without siblings."""
    counts: Counter[str] = Counter()
    for name, count in siblings.items():
        state = nodes.get(name)
        value = _value(state, key) if state is not None and count > 0 else None
        if value is not None:
            counts[value] += count
    if not counts:
        return None
    return min(counts, key=lambda v: (-counts[v], v))


def _value(state: NodeState, key: str) -> str | None:
    """The node's domain at `key` (the node itself for the hostname level)."""
    return state.name if key == HOSTNAME else state.labels.get(key)


def _free(state: NodeState) -> int:
    return GPUSummary.of(state).whole_free


def _groups(cluster: ClusterState, pool: Sequence[str], key: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name in pool:
        value = _value(cluster.nodes[name], key)
        if value is not None:
            out.setdefault(value, []).append(name)
    return out


def _domains(
    cluster: ClusterState, pool: Sequence[str], key: str, wanted: int, siblings: Mapping[str, int]
) -> tuple[list[tuple[str, list[str]]], list[tuple[str, int]]]:
    """The domains of `key` that could hold `wanted` whole GPUs, in the order they are tried, and
    those that could not with their free GPUs."""
    groups = _groups(cluster, pool, key)
    free = {v: sum(_free(cluster.nodes[n]) for n in g) for v, g in groups.items()}
    near = {v for v, g in groups.items() if any(siblings.get(n) for n in g)}
    fit = [v for v in groups if free[v] >= wanted]
    fit.sort(key=lambda v: (v not in near, free[v], v))
    short = sorted((v for v in groups if free[v] < wanted), key=lambda v: (-free[v], v))
    return [(v, groups[v]) for v in fit], [(v, free[v]) for v in short]


def _fewest_domains(
    cluster: ClusterState,
    members: Sequence[PodRequest],
    settings: GangPlanSettings,
    key: str,
    pool: Sequence[str],
    wanted: int,
    siblings: Mapping[str, int],
) -> GangPlan | None:
    """The fewest domains of `key` (the roomiest first) whose nodes hold the gang together."""
    groups = _groups(cluster, pool, key)
    free = {v: sum(_free(cluster.nodes[n]) for n in g) for v, g in groups.items()}
    order = sorted(groups, key=lambda v: (-free[v], v))
    nodes: list[str] = []
    room = 0
    for k, value in enumerate(order, start=1):
        nodes += groups[value]
        room += free[value]
        if k < 2 or room < wanted:
            continue
        found = plan_gang(cluster, members, settings, siblings=siblings, names=nodes)
        if isinstance(found, GangPlan):
            return found
    return None


def _spans(cluster: ClusterState, plan: GangPlan, keys: Sequence[str]) -> tuple[int, ...]:
    """How many domains of each level the plan's nodes are in, widest level first."""
    states = [cluster.nodes[n] for n in plan.nodes]
    return tuple(len({_value(s, key) for s in states}) for key in reversed(keys))


def _waiting(levels: Levels, members: int, tried: list[tuple[str, str]]) -> str:
    """Why a gang with a required level waits: the level and the domains tried, and why not."""
    shown = "; ".join(f"{value}: {why}" for value, why in tried[:SHOWN])
    more = len(tried) - SHOWN
    detail = f" (tried {shown}" + (f"; and {more} more" if more > 0 else "") + ")" if tried else ""
    return f"{levels.what}: no {levels.names[-1]} holds all {plural(members, 'member')}{detail}"
