"""Fragmentation of a node's idle GPU capacity with respect to a workload mix (FGD, ATC '23, §3).

A node's idle GPU share is *fragment* for a task shape when that task cannot use it: the task
needs no GPU, rejects the node's GPU model, does not fit (GPU or CPU), or fits but the GPU in
question has less free share than the task needs per GPU. The node's fragmentation is the
expectation over the mix; placing a task where fragmentation grows least is FGD.

Pure functions over the per-node summary the scorer keeps: per-GPU free share in percent
(0..100, index = GPU minor), free CPU in milli-cores, and the node's GPU model (through the
:class:`~allocator.core.scoring.workload_mix.CompiledMix` for that model). Results are in GPU
percent (100 = one whole GPU).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from allocator.core.scoring.workload_mix import CompiledMix, TaskShape, WorkloadMix

#: Highest value of :func:`growth_score`.
MAX_GROWTH_SCORE = 99


def node_fragment(free_pct: Sequence[int], cpu_free_milli: int, mix: CompiledMix) -> float:
    """Expected idle GPU share (percent) on the node that the next task from ``mix`` cannot use.

    Written as ``idle - usable``: a shape that fits contributes the free share of the GPUs that
    can hold its per-GPU request; every other shape (including CPU-only ones) leaves all idle
    share as fragment.
    """
    idle = sum(free_pct)
    if idle == 0:
        return 0.0
    usable = 0.0
    for group in mix.groups:
        weight = group.weight_fitting_cpu(cpu_free_milli)
        if weight == 0.0:
            continue
        need = group.gpu_pct
        count = 0
        share = 0
        for free in free_pct:
            if free >= need:
                count += 1
                share += free
        if count >= group.gpu_count:
            usable += weight * share
    return idle - usable


def whole_gpu_pick(free_pct: Sequence[int], count: int) -> tuple[int, ...] | None:
    """The lowest-index fully free GPUs (what Open-Gpu-Share and Koordinator's default do)."""
    picked = tuple(i for i, free in enumerate(free_pct) if free == 100)[:count]
    return picked if len(picked) == count else None


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a task would go on one node and how much the node's fragmentation would grow."""

    gpus: tuple[int, ...]
    growth: float  # fragment after minus fragment before, GPU percent; lower is better


def placement_options(
    free_pct: Sequence[int], cpu_free_milli: int, task: TaskShape, mix: CompiledMix
) -> list[Placement]:
    """Every distinct way to place ``task`` on the node, with the fragmentation growth of each.

    A sharing task is tried on each GPU with enough free share (GPUs with equal free share give
    equal results; the lowest index stands for them). Whole-GPU tasks take the lowest-index fully
    free GPUs; CPU-only tasks change only CPU. Empty when the GPU part does not fit; CPU and memory
    feasibility are the caller's filter.
    """
    cpu_after = cpu_free_milli - task.cpu_milli
    before = node_fragment(free_pct, cpu_free_milli, mix)
    if task.cpu_only:
        return [Placement((), node_fragment(free_pct, cpu_after, mix) - before)]
    if task.gpu_pct == 100:
        picked = whole_gpu_pick(free_pct, task.gpu_count)
        if picked is None:
            return []
        after = list(free_pct)
        for i in picked:
            after[i] = 0
        return [Placement(picked, node_fragment(after, cpu_after, mix) - before)]
    options: list[Placement] = []
    seen: set[int] = set()
    after = list(free_pct)
    for i, free in enumerate(free_pct):
        if free < task.gpu_pct or free in seen:
            continue
        seen.add(free)
        after[i] = free - task.gpu_pct
        options.append(Placement((i,), node_fragment(after, cpu_after, mix) - before))
        after[i] = free
    return options


def best_placement(
    free_pct: Sequence[int], cpu_free_milli: int, task: TaskShape, mix: CompiledMix
) -> Placement | None:
    """The placement on this node with the least fragmentation growth (ties: lowest GPU index)."""
    options = placement_options(free_pct, cpu_free_milli, task, mix)
    if not options:
        return None
    return min(options, key=lambda p: (p.growth, p.gpus))


def growth_score(growth_pct: float) -> int:
    """0..99, higher is better: ⌊100·σ(−growth / one GPU)⌋, FGD's own scale.

    The coarse steps (one point ≈ 4% of a GPU near zero) are deliberate. Trace replay shows that
    comparing growth exactly is *worse* (5.7% vs 4.7% unallocated on openb default): near-equal
    placements must tie so that a stable node order decides among them, which packs load onto
    the same nodes (first-fit) and keeps others whole.
    """
    x = -growth_pct / 100.0
    if x < -700.0:
        return 0
    return min(int(100.0 / (1.0 + math.exp(-x))), MAX_GROWTH_SCORE)


@dataclass(frozen=True, slots=True)
class NodeScore:
    """How good a node is for a task: ``score`` 0..99, higher is better; equal scores go to a
    stable node order the caller keeps (see :func:`growth_score`). ``gpus`` are the GPU indices
    to allocate."""

    score: int
    gpus: tuple[int, ...]


def score_node(
    free_pct: Sequence[int], cpu_free_milli: int, model: str, task: TaskShape, mix: WorkloadMix
) -> NodeScore | None:
    """topoalloc's fragmentation score of a node that passed the resource filter (CPU, memory,
    GPU model); None when the task's GPU part does not fit.

    The GPU for a sharing task is the lowest-index one among those with the best growth score
    (FGD's rule): trace replay shows choosing by exact growth instead loses up to half a point
    (openb gpushare40: 6.56% vs 6.07% unallocated).
    """
    options = placement_options(free_pct, cpu_free_milli, task, mix.compiled_for(model))
    if not options:
        return None
    best = max(options, key=lambda p: (growth_score(p.growth), [-g for g in p.gpus]))
    return NodeScore(growth_score(best.growth), best.gpus)
