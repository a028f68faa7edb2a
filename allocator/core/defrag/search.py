"""The cheapest set of movers that unblocks one waiter: fewest pods, then the fewest GPU-hours of
work thrown away, then names (so equal choices come out the same).

Exact while the subsets stay within the settings' budget: subsets by size, cheapest first within a
size, each one tried for real (`scratch.attempt`); a subset that cannot give the waiter's largest
member a node with enough whole GPUs is skipped untried when no node has one now. Past the budget:
nodes are cleared cheapest first (fewest movable pods, then GPU-hours) until the waiter fits, and
then every mover it does not need is put back, the costliest first (an inclusion-minimal set).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations
from math import comb

from allocator.core.cluster.state import ClusterState
from allocator.core.defrag.blocks import node_block
from allocator.core.defrag.inputs import DefragPlanSettings, PodFacts, Waiter
from allocator.core.defrag.scratch import Found, attempt

# Clearing whole nodes may gather more movers than a plan may make; spare trims them afterwards.
GATHER_FACTOR = 4


def cost(movers: Sequence[PodFacts], now: float) -> tuple[int, float, tuple[str, ...]]:
    return (
        len(movers),
        round(sum(p.gpu_hours(now) for p in movers), 6),
        tuple(sorted(p.key for p in movers)),
    )


def cheapest_moves(
    cluster: ClusterState,
    waiter: Waiter,
    movable: Sequence[PodFacts],
    pool: Sequence[str],
    settings: DefragPlanSettings,
    now: float,
    limit: int,
) -> tuple[Found, bool] | None:
    """(the moves, whether they are the cheapest there are) or None when no set of at most
    `limit` movers unblocks the waiter."""
    movable = sorted(movable, key=lambda p: p.key)
    found = _exact(cluster, waiter, movable, pool, settings, now, limit)
    if found is not None:
        return found, True
    found = _by_nodes(cluster, waiter, movable, pool, settings, now, limit)
    return (found, False) if found is not None else None


def _exact(
    cluster: ClusterState,
    waiter: Waiter,
    movable: list[PodFacts],
    pool: Sequence[str],
    settings: DefragPlanSettings,
    now: float,
    limit: int,
) -> Found | None:
    names = set(waiter.names) if waiter.names is not None else set(pool)
    big = max((m.gpu.count for m in waiter.members if m.gpu is not None and not m.gpu.shared), default=0)
    blocks = {n: node_block(cluster.nodes[n]) for n in names if n in cluster.nodes}
    prune = big > 0 and max(blocks.values(), default=0) < big
    seen = checks = 0
    for k in range(1, min(limit, len(movable)) + 1):
        seen += comb(len(movable), k)
        if seen > settings.subsets:
            return None
        combos = []
        for combo in combinations(movable, k):
            if prune and not _opens_block(combo, blocks, big):
                continue
            combos.append((cost(combo, now), combo))
        for _, combo in sorted(combos, key=lambda cc: cc[0]):
            checks += 1
            if checks > settings.checks:
                return None
            found = attempt(cluster, waiter, combo, pool, settings.plan)
            if found is not None:
                return found
    return None


def _opens_block(combo: Sequence[PodFacts], blocks: dict[str, int], big: int) -> bool:
    freed: dict[str, int] = {}
    for p in combo:
        freed[p.node] = freed.get(p.node, 0) + p.gpus
    return any(blocks.get(n, 0) + g >= big for n, g in freed.items())


def _by_nodes(
    cluster: ClusterState,
    waiter: Waiter,
    movable: list[PodFacts],
    pool: Sequence[str],
    settings: DefragPlanSettings,
    now: float,
    limit: int,
) -> Found | None:
    names = set(waiter.names) if waiter.names is not None else set(pool)
    on_node: dict[str, list[PodFacts]] = {}
    for p in movable:
        if p.node in names:
            on_node.setdefault(p.node, []).append(p)
    order = sorted(on_node, key=lambda n: (len(on_node[n]), sum(p.gpu_hours(now) for p in on_node[n]), n))
    movers: list[PodFacts] = []
    found = None
    for node in order:
        movers += on_node[node]
        if len(movers) > limit * GATHER_FACTOR:
            return None
        found = attempt(cluster, waiter, movers, pool, settings.plan)
        if found is not None:
            break
    if found is None:
        return None
    for p in sorted(movers, key=lambda p: (-p.gpu_hours(now), -p.gpus, p.key)):
        trial = [m for m in movers if m is not p]
        got = attempt(cluster, waiter, trial, pool, settings.plan) if trial else None
        if got is not None:
            movers, found = trial, got
    return found if len(movers) <= limit else None
