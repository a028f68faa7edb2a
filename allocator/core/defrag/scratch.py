"""Trying a set of moves on a private copy of the cluster: take the movers out, place the waiter
where the core's gang planner would, land every mover elsewhere with the same planner (so each
replacement's devices are what bind would choose, its topology kept), then check the waiter still
has a plan with the movers where they landed. The copy is left as it was after every try."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from allocator.core.cluster.state import ClusterState
from allocator.core.defrag.inputs import PodFacts, Waiter
from allocator.core.devices.allocate import Allocation
from allocator.core.gang.plan import GangPlan, GangPlanSettings, NoPlan, Placement, fork_node, plan_gang
from allocator.core.node.state import PodEntry
from allocator.core.request.pod_request import PodRequest

WAITER_PREFIX = "defrag-waiter:"  # the copy's entries for a waiter's planned room


@dataclass(frozen=True)
class Found:
    landings: tuple[tuple[PodFacts, Placement], ...]  # each mover and where its replacement goes
    plan: GangPlan | None  # the waiter's placement once they moved (None: proactive)


def fork_cluster(cluster: ClusterState) -> ClusterState:
    """A private copy of every node, for trying moves."""
    out = ClusterState(cluster.tie_seed)
    for name, state in cluster.nodes.items():
        fork = out.nodes[name] = fork_node(state)
        out.table.attach(fork)
        for key in fork.pods:
            out.pod_node[key] = name
    return out


class Trial:
    """Changes to the copy that `undo` takes back, last first."""

    def __init__(self, cluster: ClusterState) -> None:
        self.cluster = cluster
        self.taken: list[tuple[str, PodEntry]] = []
        self.added: list[tuple[str, str]] = []

    def take(self, pods: Sequence[PodFacts]) -> None:
        for p in pods:
            state = self.cluster.nodes.get(p.node)
            entry = state.pods.get(p.key) if state is not None else None
            if state is not None and entry is not None:
                state.remove_pod(p.key)
                self.taken.append((p.node, entry))

    def add(self, node: str, key: str, allocation: Allocation, req: PodRequest) -> None:
        devices = allocation.devices if allocation.devices.by_type else None
        self.cluster.nodes[node].add_pod(
            key,
            devices,
            req.cpu_milli,
            req.memory,
            nonzero_cpu_milli=req.nonzero_cpu_milli,
            nonzero_memory=req.nonzero_memory,
        )
        self.added.append((node, key))

    def drop(self, node: str, key: str) -> None:
        self.cluster.nodes[node].remove_pod(key)
        self.added.remove((node, key))

    def undo(self) -> None:
        for node, key in reversed(self.added):
            self.cluster.nodes[node].remove_pod(key)
        for node, entry in reversed(self.taken):
            self.cluster.nodes[node].add_usage(entry)
        self.added.clear()
        self.taken.clear()


def land(
    trial: Trial, movers: Sequence[PodFacts], pool: Sequence[str], settings: GangPlanSettings
) -> list[tuple[PodFacts, Placement]] | None:
    """Each mover's replacement placed (largest first) off its own node; None when one fits nowhere."""
    out = []
    for p in sorted(movers, key=lambda p: (-p.gpus, p.key)):
        names = [n for n in pool if n != p.node]
        got = plan_gang(trial.cluster, [p.request], settings, names=names)
        if isinstance(got, NoPlan):
            return None
        placed = got.placements[0]
        trial.add(placed.node, p.key, placed.allocation, p.request)
        out.append((p, placed))
    return out


def attempt(
    cluster: ClusterState,
    waiter: Waiter,
    movers: Sequence[PodFacts],
    pool: Sequence[str],
    settings: GangPlanSettings,
) -> Found | None:
    """The moves of `movers` that make `waiter` fit, or None (see the module)."""
    trial = Trial(cluster)
    names = list(waiter.names) if waiter.names is not None else list(pool)
    try:
        trial.take(movers)
        first = plan_gang(cluster, waiter.members, settings, names=names)
        if isinstance(first, NoPlan):
            return None
        held = [(p.node, f"{WAITER_PREFIX}{p.key}") for p in first.placements]
        for (node, key), placed, req in zip(held, first.placements, waiter.members, strict=True):
            trial.add(node, key, placed.allocation, req)
        landings = land(trial, movers, pool, settings)
        if landings is None:
            return None
        for node, key in held:
            trial.drop(node, key)
        final = plan_gang(cluster, waiter.members, settings, names=names)
        return Found(tuple(landings), final) if isinstance(final, GangPlan) else None
    finally:
        trial.undo()


def commit(cluster: ClusterState, found: Found, waiter: Waiter | None) -> None:
    """Apply moves (and the waiter's placement) to the copy for the next waiter's planning."""
    for p, placed in found.landings:
        cluster.unassign(p.key)
        _assign(cluster, p.key, placed, p.request)
    if found.plan is not None and waiter is not None:
        for placed, req in zip(found.plan.placements, waiter.members, strict=True):
            _assign(cluster, f"{WAITER_PREFIX}{placed.key}", placed, req)


def _assign(cluster: ClusterState, key: str, placed: Placement, req: PodRequest) -> None:
    devices = placed.allocation.devices
    cluster.assign(
        key,
        placed.node,
        devices if devices.by_type else None,
        req.cpu_milli,
        req.memory,
        nonzero_cpu_milli=req.nonzero_cpu_milli,
        nonzero_memory=req.nonzero_memory,
    )
