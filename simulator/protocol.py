"""The FGD paper's evaluation protocol (../shared/traces/openb/FGD-PROTOCOL.md §2): seeded arrival
order, inflation or deflation of the workload to 130% of GPU capacity, seeded node ranking for
ties, and the target workload built from the original trace.

One seeded stream drives, in this order, the pod shuffle, the tuning draws, the node ranking and
then the Random policy's choices, as in the artifact. Bit-for-bit agreement with Go's math/rand is
not possible (nor needed: the protocol asks for agreement within the seed-to-seed spread).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from allocator.core.scoring.workload_mix import DEFAULT_COVERAGE, WorkloadMix
from simulator.openb import GPU_MILLI, OpenbNode, OpenbPod

TUNE_RATIO = 1.3


def capacity_milli(nodes: Sequence[OpenbNode]) -> int:
    return sum(n.gpu_count for n in nodes) * GPU_MILLI


def tune(
    pods: list[OpenbPod], original: Sequence[OpenbPod], target_milli: float, rng: random.Random
) -> list[OpenbPod]:
    """Stretch or cut ``pods`` (already in arrival order) to about ``target_milli`` of GPU demand.

    Up: clones drawn uniformly with replacement from ``original`` are appended until the first
    draw whose *per-GPU* milli would cross the target (the artifact's stopping test, which lets an
    8-GPU clone overshoot). Down: uniformly chosen pods are deleted until demand <= target.
    """
    total = sum(p.gpu_demand_milli for p in pods)
    out = list(pods)
    if total < target_milli:
        i = 0
        while True:
            draw = original[rng.randrange(len(original))]
            if total + draw.gpu_milli > target_milli:
                break
            out.append(replace(draw, name=f"{draw.name}-tuned-{i}"))
            total += draw.gpu_demand_milli
            i += 1
    else:
        while total > target_milli and out:
            victim = out.pop(rng.randrange(len(out)))
            total -= victim.gpu_demand_milli
    return out


@dataclass(frozen=True)
class PaperSetup:
    """Everything one seed of the paper protocol fixes before the first pod is placed."""

    seed: int
    pods: list[OpenbPod]  # arrival order, after tuning
    node_rank: list[int]  # node index (name order) -> tie-break rank; lower wins ties
    rng: random.Random  # the stream after setup: drives the Random policy


def paper_setup(
    nodes: Sequence[OpenbNode], trace_pods: Sequence[OpenbPod], seed: int, tune_ratio: float = TUNE_RATIO
) -> PaperSetup:
    """Seeded shuffle of the name-sorted pods, tuning to ``tune_ratio`` of capacity, and the node
    ranking (the artifact prefixes node names with a seeded permutation and lets the
    lexicographically smallest name win ties)."""
    rng = random.Random(seed)
    by_name = sorted(trace_pods, key=lambda p: p.name)
    ordered = list(by_name)
    rng.shuffle(ordered)
    pods = tune(ordered, by_name, tune_ratio * capacity_milli(nodes), rng)
    nodes_by_name = sorted(range(len(nodes)), key=lambda i: nodes[i].name)
    perm = list(range(len(nodes)))
    rng.shuffle(perm)
    rank = [0] * len(nodes)
    for position, node_index in enumerate(nodes_by_name):
        rank[node_index] = perm[position]
    return PaperSetup(seed, pods, rank, rng)


def target_workload(trace_pods: Sequence[OpenbPod], coverage: float = DEFAULT_COVERAGE) -> WorkloadMix:
    """FGD's target workload M: shapes of the original (untuned) trace, CPU-only tasks included,
    the most frequent ones covering 95% of tasks, renormalised."""
    return WorkloadMix.from_tasks((p.shape() for p in trace_pods), coverage)


def parse_seeds(text: str) -> list[int]:
    """``42-51`` or ``42,43,50`` or a mix of both."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            if sep:
                a, b = int(lo), int(hi)
                if b < a:
                    raise ValueError
                seeds.extend(range(a, b + 1))
            else:
                seeds.append(int(part))
        except ValueError:
            raise ValueError(f"bad seed list {text!r}: use e.g. 42-51 or 42,45") from None
    if not seeds:
        raise ValueError("no seeds given")
    return seeds
