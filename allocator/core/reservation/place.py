"""Placing a Reservation: its node and devices chosen with the same core as a pod's.

`place` takes the template's request through what a pod goes through: the nodes whose devices
can take it (`ClusterState.feasible`), node affinity and cpu/memory/pod room (`resources_fit`),
then the scorer's ranking (topology quality, NIC pairing, fragmentation) and the bind path's
device choice on the best node (`ClusterState.allocate` with the scorer). A template whose
`numa-topology-spec` asks for SingleNUMANode gets its devices inside one NUMA node, whose number
comes back so the room's cpu and memory are recorded against it. A gang of reservations is
placed all at once with the gang planner (`gang.plan.plan_gang`), or with preemption
(`gang.preemption.plan_with_preemption`), the same machinery as a gang of pods.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from allocator.core.cluster.state import ClusterState, affinity_matches, resources_fit
from allocator.core.devices.allocate import Allocation
from allocator.core.reasons import Rejection, plural
from allocator.core.request.pod_request import PodRequest
from allocator.core.scoring.device import DeviceScoring
from allocator.core.scoring.scorer import NodeScorer

SINGLE_NUMA = "SingleNUMANode"
REASONS_SHOWN = 3
AFFINITY = "node(s) didn't match the template's node affinity/selector"


@dataclass(frozen=True)
class RoomPlan:
    node: str
    allocation: Allocation
    numa: int | None = None  # the one NUMA node of its devices (SingleNUMANode templates)


@dataclass(frozen=True)
class NoRoom:
    message: str
    unresolvable: bool = False  # no node could ever take it as the cluster is built


def wants_single_numa(req: PodRequest) -> bool:
    return req.numa_spec is not None and req.numa_spec.numa_topology_policy == SINGLE_NUMA


def place(
    cluster: ClusterState,
    req: PodRequest,
    names: Iterable[str] | None = None,
    *,
    scorer: NodeScorer,
    scoring: DeviceScoring | None = None,
    refused: Mapping[str, Rejection] | None = None,
) -> RoomPlan | NoRoom:
    """The best node for the template among `names` (default: every node) and its devices there.
    `refused`: nodes of `names` ruled out beforehand, with their reason (DRA-mode nodes for a
    template of device resources), counted in the answer like any other."""
    if req.invalid is not None:
        return NoRoom(f"the template is invalid: {req.invalid.message}", unresolvable=True)
    pool = list(cluster.nodes if names is None else names)
    if not pool:
        return NoRoom("no node admits the template (taints, cordons or nodeName)", unresolvable=True)
    refused = refused or {}
    candidates = [n for n in pool if n not in refused] if refused else pool
    passed, failed = cluster.feasible(req, candidates) if req.devices else (candidates, {})
    reasons: dict[str, Rejection] = {n: refused[n] for n in pool if n in refused}
    reasons.update(failed)
    ok = []
    for name in passed:
        state = cluster.nodes.get(name)
        if state is None:
            continue
        if not affinity_matches(state, req):
            reasons[name] = Rejection("NodeAffinity", AFFINITY, unresolvable=True)
        elif (short := resources_fit(state, req)) is not None:
            reasons[name] = short
        else:
            ok.append(name)
    for name in cluster.rank(req, ok, scorer) if ok else ():
        got = _allocate(cluster, req, name, scorer, scoring)
        if isinstance(got, RoomPlan):
            return got
        reasons[name] = got
    return _no_room(reasons, len(pool))


def _allocate(
    cluster: ClusterState, req: PodRequest, name: str, scorer: NodeScorer, scoring: DeviceScoring | None
) -> RoomPlan | Rejection:
    if not wants_single_numa(req) or not req.devices:
        got = cluster.allocate(req, name, scoring, scorer=scorer)
        return RoomPlan(name, got) if isinstance(got, Allocation) else got
    state = cluster.nodes[name]
    inv = state.inventory
    numas = sorted({s.numa for t in req.device_types for s in (inv.slots(t) if inv else ()) if s.numa >= 0})
    last: Rejection = Rejection("Insufficient NUMA Scoped Devices", "no NUMA node holds all the devices")
    for numa in numas:
        got = cluster.allocate(req, name, scoring, scorer=scorer, numa_mask=[numa])
        if isinstance(got, Allocation):
            return RoomPlan(name, got, numa)
        last = Rejection(got.code, f"no single NUMA node holds the devices: {got.message}", got.unresolvable)
    return last


def _no_room(reasons: dict[str, Rejection], pool: int) -> NoRoom:
    counts = Counter(r.message for r in reasons.values())
    top = "; ".join(f"{c} {msg}" for msg, c in counts.most_common(REASONS_SHOWN))
    unresolvable = bool(reasons) and all(r.unresolvable for r in reasons.values())
    return NoRoom(f"0/{plural(pool, 'node')} can hold it" + (f": {top}" if top else ""), unresolvable)
