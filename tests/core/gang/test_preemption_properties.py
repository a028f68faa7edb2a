"""Victim selection against a brute-force oracle on small random clusters.

The oracle knows nothing of the planner's search: it tries every subset of what may be evicted
(its own grouping of gangs and its own priority rule), rebuilds the cluster from scratch without
that subset, asks the gang planner (or the device allocator, for one node) whether the preemptor
fits, and keeps the cheapest subset by the documented order: fewest pods, then the highest
priority among them, then the sum of priorities, then GPUs held, then names.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain, combinations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocator.core.cluster.state import ClusterState, resources_fit
from allocator.core.devices.allocate import Allocation, allocate
from allocator.core.gang.plan import GangPlan, NoPlan, plan_gang
from allocator.core.gang.preemption import PreemptionPlan, node_victims, plan_with_preemption
from allocator.core.gang.victims import Budget, Candidate
from allocator.core.node.gpu_summary import GPUSummary
from allocator.core.request.parse import pod_request
from allocator.core.request.pod_request import PodRequest
from apis.annotations import DeviceAllocations
from tests.core.pods import gpus, hint, pod
from tests.support.machines import l40s_device

PROPS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NODES = ("n0", "n1")


@dataclass(frozen=True)
class Running:
    key: str
    node: str
    priority: int
    gang: str
    devices: DeviceAllocations
    gpus: int


def empty_cluster() -> ClusterState:
    c = ClusterState()
    for name in NODES:
        c.upsert_node({"metadata": {"name": name}, "status": {}})
        c.set_device(l40s_device(name))
    return c


def build(spec: list[tuple[int, int, int, str]]) -> list[Running]:
    """Place each (node, gpus, priority, gang) pod with the real allocator; skip what does not fit."""
    c = empty_cluster()
    out = []
    for i, (node, count, priority, gang) in enumerate(spec):
        name = NODES[node]
        req = pod_request(pod(gpus(count), name=f"r{i}", namespace="run"))
        got = allocate(c.nodes[name], req)
        if not isinstance(got, Allocation):
            continue
        c.assign(req.key, name, got.devices)
        out.append(Running(req.key, name, priority, gang, got.devices, count))
    return out


def cluster_with(running: list[Running], gone: set[str] = frozenset()) -> ClusterState:  # type: ignore[assignment]
    c = empty_cluster()
    for r in running:
        if r.key not in gone:
            c.assign(r.key, r.node, r.devices)
    return c


def candidates(running: list[Running]) -> list[Candidate]:
    return [Candidate(r.key, r.node, r.priority, r.gang) for r in running]


def oracle_units(running: list[Running], below: int, node: str | None = None) -> list[list[Running]]:
    groups: dict[str, list[Running]] = {}
    for r in running:
        groups.setdefault(r.gang or r.key, []).append(r)
    return [
        g
        for g in groups.values()
        if all(r.priority < below for r in g) and (node is None or all(r.node == node for r in g))
    ]


def oracle_cost(units: tuple[list[Running], ...]) -> tuple[object, ...]:
    pods = [r for u in units for r in u]
    names = sorted(f"gang {u[0].gang}" if u[0].gang else u[0].key for u in units)
    return (
        len(pods),
        max((r.priority for r in pods), default=-(2**31)),
        sum(r.priority for r in pods),
        sum(r.gpus for r in pods),
        tuple(names),
    )


def subsets(units: list[list[Running]]) -> list[tuple[list[Running], ...]]:
    return list(chain.from_iterable(combinations(units, k) for k in range(len(units) + 1)))


def members_of(count: int, size: int, priority: int, scoped: bool) -> list[PodRequest]:
    out = []
    for i in range(count):
        extra = {"annotations": hint(gpu={"requiredTopologyScope": "PCIe"})} if scoped else {}
        raw = pod(gpus(size), name=f"m{i}", namespace="hi", **extra)  # type: ignore[arg-type]
        raw["spec"]["priority"] = priority
        out.append(pod_request(raw))
    return out


running_pods = st.lists(
    st.tuples(
        st.integers(0, 1),
        st.integers(1, 4),
        st.sampled_from([0, 5, 10]),
        st.sampled_from(["", "", "run/g1", "run/g2"]),
    ),
    min_size=1,
    max_size=6,
)


@PROPS
@given(
    running_pods,
    st.integers(1, 2),
    st.sampled_from([2, 4, 6, 8]),
    st.sampled_from([5, 10]),
    st.booleans(),
)
def test_gang_victims_are_the_cheapest_set_and_obey_the_rules(
    spec: list[tuple[int, int, int, str]], count: int, size: int, priority: int, scoped: bool
) -> None:
    scoped = scoped and size == 2  # an L40S switch holds two GPUs
    running = build(spec)
    members = members_of(count, size, priority, scoped)
    got = plan_with_preemption(cluster_with(running), members, candidates(running))

    units = oracle_units(running, priority)
    best = None
    for subset in subsets(units):
        gone = {r.key for u in subset for r in u}
        if isinstance(plan_gang(cluster_with(running, gone), members), GangPlan):
            cost = oracle_cost(subset)
            best = cost if best is None or cost < best else best
    if best is None:
        assert isinstance(got, NoPlan)
        return
    assert isinstance(got, PreemptionPlan) and got.exact
    by_key = {r.key: r for r in running}
    victims = [by_key[v.key] for v in got.victims]
    # The priority rule, and gangs only whole.
    assert all(v.priority < priority for v in victims)
    for gang in {v.gang for v in victims if v.gang}:
        assert {r.key for r in running if r.gang == gang} <= {v.key for v in victims}
    # Minimal: exactly the oracle's cheapest subset.
    chosen = tuple(u for u in units if u[0].key in {v.key for v in victims})
    assert oracle_cost(chosen) == best
    # The plan itself holds once the victims are gone: every member's GPUs are free there.
    after = cluster_with(running, {v.key for v in victims})
    for placement in got.plan.placements:
        state = after.nodes[placement.node]
        for minor in placement.allocation.minors("gpu"):
            assert GPUSummary.of(state).whole_mask >> minor & 1
        after.assign(placement.key, placement.node, placement.allocation.devices)


@PROPS
@given(running_pods, st.sampled_from([1, 2, 3, 4, 8]), st.sampled_from([5, 10]), st.booleans())
def test_node_victims_are_the_cheapest_set_on_that_node(
    spec: list[tuple[int, int, int, str]], size: int, priority: int, scoped: bool
) -> None:
    scoped = scoped and size == 2
    running = build(spec)
    (req,) = members_of(1, size, priority, scoped)
    for node in NODES:
        got = node_victims(cluster_with(running).nodes[node], req, candidates(running))
        best = None
        for subset in subsets(oracle_units(running, priority, node)):
            state = cluster_with(running, {r.key for u in subset for r in u}).nodes[node]
            if resources_fit(state, req) is None and isinstance(allocate(state, req), Allocation):
                cost = oracle_cost(subset)
                best = cost if best is None or cost < best else best
        if best is None:
            assert got is None
            continue
        assert got is not None and got.exact
        keys = {v.key for v in got.victims}
        assert all(v.node == node and v.priority < priority for v in got.victims)
        chosen = tuple(u for u in oracle_units(running, priority, node) if u[0].key in keys)
        assert sum(len(u) for u in chosen) == len(keys)  # whole units only
        assert oracle_cost(chosen) == best


@PROPS
@given(running_pods, st.integers(1, 2), st.sampled_from([2, 4, 8]), st.sampled_from([5, 10]))
def test_over_budget_the_victims_still_make_room_and_none_is_spare(
    spec: list[tuple[int, int, int, str]], count: int, size: int, priority: int
) -> None:
    running = build(spec)
    members = members_of(count, size, priority, False)
    got = plan_with_preemption(cluster_with(running), members, candidates(running), budget=Budget(0, 0))
    if isinstance(got, NoPlan) or not got.victims:
        return
    keys = {v.key for v in got.victims}
    assert all(v.priority < priority for v in got.victims)
    units = [u for u in oracle_units(running, priority) if u[0].key in keys]
    assert sum(len(u) for u in units) == len(keys)  # whole gangs
    nodes = got.plan.nodes
    assert isinstance(plan_gang(cluster_with(running, keys), members, names=nodes), GangPlan)
    for u in units:  # inclusion-minimal on the plan's nodes (or a unit elsewhere would be spare)
        spared = keys - {r.key for r in u}
        assert isinstance(plan_gang(cluster_with(running, spared), members, names=nodes), NoPlan) or not any(
            r.node in nodes for r in u
        )
