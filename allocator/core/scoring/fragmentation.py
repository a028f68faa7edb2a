"""Fragmentation of a node's idle GPU capacity with respect to a workload mix.

Two measures live here, both pure functions over the per-node summary the scorer keeps (per-GPU
free share in percent, 0..100, index = GPU minor; free CPU in milli-cores; optionally free memory
in MiB; the node's GPU model through the
:class:`~allocator.core.scoring.workload_mix.CompiledMix` for that model). Results are in GPU
percent (100 = one whole GPU).

*FGD's measure* (ATC '23, §3; :func:`node_fragment`, :func:`placement_options`): a node's idle
GPU share is fragment for a task shape when that task cannot use it (no GPU wanted, model
rejected, GPU or CPU does not fit, or the GPU has less free share than the task needs per GPU);
the node's fragmentation is the expectation over the mix. It is the *next* task's view: a 53%
hole counts as 81% fragment on openb because most tasks cannot use it, although the 0.47-GPU
tasks that fill it arrive all the time.

*topoalloc's measure* (:func:`node_waste`, :func:`score_node`): the idle share that is expected
to stay unused for good. A GPU with ``f`` percent free keeps the best of the next
:data:`HORIZON` tasks drawn from the mix (the one leaving the least waste, recursively); a free
share no drawn task fits stays idle. Only tasks whose CPU and memory still fit the node count, so
a node whose CPU runs out strands its GPUs, and idle GPU beyond what the node's free CPU can feed
at the mix's CPU per GPU counts as waste too (:func:`cpu_starved`). A task is placed by three
keys, higher is better:
the node effect (waste growth minus the task's own hole change, plus the model pressure), rounded
to :data:`NODE_STEP_PCT` so that placements with no material effect tie; then the hole change
itself (exact, node-independent: which hole the task completes best); then a stable node order
(first fit). docs/research/fgd-analysis.md has the measurements behind each choice.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from allocator.core.scoring.workload_mix import CompiledMix, TaskShape, WorkloadMix

#: How many future tasks a hole may wait for (openb default: 24 is best, 8 and 64 lose 0.3-0.8
#: points of unallocated GPU; docs/research/fgd-analysis.md).
HORIZON = 24

#: Node effects closer than this (GPU percent) tie, so a stable node order packs nodes one after
#: another; exact comparison spreads tasks over every node and doubles unallocated GPU on openb.
NODE_STEP_PCT = 5.0

FULL = 100

#: A node's free CPU feeds its idle GPUs at the mix's CPU per GPU (:func:`cpu_starved`); the
#: measure reads free CPU for this in whole steps of this many milli-cores, so nodes a few cores
#: apart share scores (docs/research/fgd-analysis.md: steps of 1, 2 and 4 cores pack alike).
CPU_BUDGET_STEP_MILLI = 2000


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
    return [
        Placement(gpus, node_fragment(after, cpu_after, mix) - before)
        for gpus, after in candidate_fills(free_pct, task)
    ]


def candidate_fills(
    free_pct: Sequence[int], task: TaskShape
) -> Iterator[tuple[tuple[int, ...], Sequence[int]]]:
    """The distinct GPU choices for ``task`` on a node, each with the per-GPU free shares after it:
    nothing for a CPU-only task, the lowest-index fully free GPUs for whole GPUs (none when too
    few), and for a sharing task each GPU with enough free share (equal free shares give equal
    results, so the lowest index stands for them). The yielded list is reused: read it before
    asking for the next."""
    if task.cpu_only:
        yield (), free_pct
        return
    if task.gpu_pct == FULL:
        picked = whole_gpu_pick(free_pct, task.gpu_count)
        if picked is not None:
            after = list(free_pct)
            for i in picked:
                after[i] = 0
            yield picked, after
        return
    seen: set[int] = set()
    after = list(free_pct)
    for i, free in enumerate(free_pct):
        if free < task.gpu_pct or free in seen:
            continue
        seen.add(free)
        after[i] = free - task.gpu_pct
        yield (i,), after
        after[i] = free


def best_placement(
    free_pct: Sequence[int], cpu_free_milli: int, task: TaskShape, mix: CompiledMix
) -> Placement | None:
    """The placement on this node with the least fragmentation growth (ties: lowest GPU index)."""
    options = placement_options(free_pct, cpu_free_milli, task, mix)
    if not options:
        return None
    return min(options, key=lambda p: (p.growth, p.gpus))


# ------------------------------------------------------------------ topoalloc's measure


def best_of_draws(options: Sequence[tuple[float, float]], idle: float, horizon: int) -> float:
    """Expected waste of a hole that keeps the best of the next ``horizon`` tasks.

    ``options`` are (waste left if this shape fills the hole, probability of the shape) for the
    shapes that fit; with probability (1 − Σp)^horizon none of them comes and ``idle`` is wasted.
    The best option among the draws is the one with the least waste.
    """
    out = 0.0
    left = 1.0
    none_yet = 1.0  # P(no draw among the better options so far)
    for waste, p in sorted(options):
        left -= p
        nxt = max(0.0, left) ** horizon
        out += (none_yet - nxt) * waste
        none_yet = nxt
    return out + none_yet * idle


@lru_cache(maxsize=4096)
def hole_waste_table(shares: tuple[tuple[int, float], ...], horizon: int = HORIZON) -> tuple[float, ...]:
    """V[f] for f = 0..100: expected waste of a GPU with f percent free that only GPU-sharing
    tasks of the given (share, probability) can fill, each fill leaving a smaller hole (V[f −
    share]). V[100] is 0 by convention: a fresh GPU's fate is the node's business (whole-GPU
    tasks, see :func:`node_waste`); the table ranks partial holes."""
    v = [0.0] * (FULL + 1)
    for f in range(1, FULL):
        v[f] = best_of_draws([(v[f - pct], w) for pct, w in shares if pct <= f], float(f), horizon)
    return tuple(v)


def _fitting_shapes(
    free_pct: Sequence[int], cpu_free_milli: int, memory_free_mib: int | None, mix: CompiledMix
) -> tuple[tuple[tuple[int, float], ...], float]:
    """(share, weight) of the sharing shapes whose CPU and memory fit the node, and the weight of
    the whole-GPU shapes that fit it (CPU, memory and enough fully free GPUs)."""
    full = sum(1 for f in free_pct if f >= FULL)
    shares: list[tuple[int, float]] = []
    whole = 0.0
    for group in mix.groups:
        w = group.weight_fitting(cpu_free_milli, memory_free_mib)
        if w == 0.0:
            continue
        if group.gpu_pct < FULL:
            shares.append((group.gpu_pct, w))
        elif group.gpu_count <= full:
            whole += w
    return tuple(shares), whole


def node_waste(
    free_pct: Sequence[int],
    cpu_free_milli: int,
    mix: CompiledMix,
    memory_free_mib: int | None = None,
    horizon: int = HORIZON,
) -> float:
    """Expected idle GPU share (percent) on the node that no task of ``mix`` will ever use.

    Each GPU's free share is a hole that keeps the best of the next ``horizon`` tasks that fit
    the node's CPU and memory (see :func:`best_of_draws`); a fully free GPU may also take a
    whole-GPU task, which leaves nothing. Memory is checked only when ``memory_free_mib`` is given.
    """
    if not any(free_pct):
        return 0.0
    shares, whole = _fitting_shapes(free_pct, cpu_free_milli, memory_free_mib, mix)
    table = hole_waste_table(shares, horizon)
    total = 0.0
    fresh: float | None = None
    for f in free_pct:
        if 0 < f < FULL:
            total += table[f]
        elif f >= FULL:
            if fresh is None:
                options = [(table[FULL - pct], w) for pct, w in shares]
                if whole:
                    options.append((0.0, whole))
                fresh = best_of_draws(options, float(FULL), horizon)
            total += fresh
    return total + cpu_starved(free_pct, cpu_free_milli, mix)


def cpu_starved(free_pct: Sequence[int], cpu_free_milli: int, mix: CompiledMix) -> float:
    """Idle GPU share (percent) the node's free CPU cannot feed: GPU tasks need CPU at the mix's
    rate (:attr:`CompiledMix.cpu_per_gpu_pct`), so idle share beyond free CPU / rate (free CPU
    read in :data:`CPU_BUDGET_STEP_MILLI` steps) stays idle. The holes' fit checks each task's
    CPU against all of the node's free CPU, as if each hole had it to itself; this term sees
    that they share it. It is added to the holes' waste rather than netted against it, so it
    does not depend on which GPU a task takes and the task's own hole change stays the rank
    key's second part (netting them scored 3.97 on openb default, adding 3.94)."""
    rate = mix.cpu_per_gpu_pct
    if rate <= 0:
        return 0.0
    fed = max(0, cpu_budget_step(cpu_free_milli)) * CPU_BUDGET_STEP_MILLI / rate
    return max(0.0, sum(free_pct) - fed)


def cpu_budget_step(cpu_free_milli: int) -> int:
    """Whole :data:`CPU_BUDGET_STEP_MILLI` steps of free CPU: all the CPU budget reads of it."""
    return cpu_free_milli // CPU_BUDGET_STEP_MILLI


@dataclass(frozen=True, slots=True)
class NodeScore:
    """How good a node is for a task.

    ``key`` orders nodes (higher is better; compare lexicographically, equal keys go to a stable
    node order the caller keeps): see :func:`rank_key`. ``node_cost`` is the waste growth beyond
    the task's own hole plus the model pressure cost and ``hole_cost`` the task's own hole
    change, both GPU percent, lower is better. ``score`` is ``key`` as one number in 0..100 that
    keeps its order exactly (:func:`key_value`), for callers that rank by a weighted sum with
    other components. ``gpus`` are the GPU indices to allocate.
    """

    score: float
    gpus: tuple[int, ...]
    node_cost: float = 0.0
    hole_cost: float = 0.0
    key: tuple[float, float] = field(default=(0.0, 0.0))


def rank_key(node_cost: float, hole_cost: float) -> tuple[float, float]:
    """The ordering key of a placement: node cost rounded to :data:`NODE_STEP_PCT` (rounding,
    not a fixed threshold, keeps a cost of exactly 0 in the middle of its step), then the exact
    hole cost."""
    return (math.floor(-node_cost / NODE_STEP_PCT + 0.5), -hole_cost)


#: Scales of :func:`key_value`: the node step at which the value is a quarter of the way from
#: the middle to either end, and the hole gain (GPU percent) at which the in-step share is 3/4.
KEY_HALF_STEPS = 20.0
HOLE_HALF_PCT = 50.0


def _squash(x: float, half: float) -> float:
    """Strictly increasing map of the reals onto (−1, 1); polynomial tails keep neighbouring
    integers apart in float64 far out (a logistic would merge them)."""
    return x / (abs(x) + half)


def _level(step: float) -> float:
    return 50.0 + 49.5 * _squash(step, KEY_HALF_STEPS)


def key_value(key: tuple[float, float]) -> float:
    """``key`` (integer node step, hole gain) as one float in (0.5, 100), order-preserving: the
    node step picks a level in (0.5, 99.5), strictly increasing; the hole gain then moves the
    value at most 99% of the way to the next level, so a better step always wins and, within a
    step, a better hole does."""
    step, hole = key
    base = _level(step)
    return base + 0.99 * (0.5 + 0.5 * _squash(hole, HOLE_HALF_PCT)) * (_level(step + 1) - base)


def score_node(
    free_pct: Sequence[int],
    cpu_free_milli: int,
    model: str,
    task: TaskShape,
    mix: WorkloadMix,
    *,
    memory_free_mib: int | None = None,
    model_pressure: float = 0.0,
    horizon: int = HORIZON,
) -> NodeScore | None:
    """topoalloc's score of a node that passed the resource filter (CPU, memory, GPU model);
    None when the task's GPU part does not fit.

    ``memory_free_mib`` enables the memory check of the mix's shapes (the task's own
    ``memory_mib`` is subtracted). ``model_pressure`` (0..1, from
    :meth:`WorkloadMix.model_pressure`) is the share of this model's idle GPU that
    model-constrained tasks are expected to claim; each GPU percent the task takes here costs
    that much. A sharing task goes to the node's GPU with the best key (ties: lowest index);
    whole-GPU tasks take the lowest-index fully free GPUs.
    """
    compiled = mix.compiled_for(model)
    canonical = hole_waste_table(compiled.sharing_weights, horizon)
    mem = memory_free_mib
    mem_after = None if mem is None else mem - task.memory_mib
    cpu_after = cpu_free_milli - task.cpu_milli
    before = node_waste(free_pct, cpu_free_milli, compiled, mem, horizon)
    pressure_cost = model_pressure * task.gpu_demand_pct

    def scored(gpus: tuple[int, ...], after: Sequence[int]) -> NodeScore:
        growth = node_waste(after, cpu_after, compiled, mem_after, horizon) - before
        hole = sum(canonical[after[g]] - canonical[free_pct[g]] for g in gpus)
        node_cost = growth - hole + pressure_cost
        key = rank_key(node_cost, hole)
        return NodeScore(key_value(key), gpus, node_cost, hole, key)

    best: NodeScore | None = None
    for gpus, after in candidate_fills(free_pct, task):
        option = scored(gpus, after)
        if best is None or option.key > best.key:
            best = option
    return best
