"""Each baseline on a hand-made 3-node cluster, with the scores worked out by hand.

n0: 2 GPUs free [100, 40] %, 8 of 16 cores free; n1: 8 idle GPUs, 96 cores; n2: GPUs [70, 100, 100, 20],
20 of 32 cores free. The task: 30% of one GPU and 2 cores.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from sim_helpers import make_state, request

from allocator.core.node.gpu_summary import GPUSummary
from allocator.core.scoring.workload_mix import TaskShape, WorkloadMix
from simulator.cluster import Choice
from simulator.policies import (
    BestFitPolicy,
    DotProdPolicy,
    FgdPolicy,
    GpuClusteringPolicy,
    GpuPackingPolicy,
    RandomPolicy,
    TopoallocPolicy,
    fgd_score,
    oracle_config,
    pick_top,
)

SPEC = [
    (16_000, 64_000, [100, 40], 8_000),
    (96_000, 393_216, [100] * 8, 96_000),
    (32_000, 131_072, [70, 100, 100, 20], 20_000),
]
RANK_N2_FIRST = [1, 2, 0]
RANK_N0_FIRST = [0, 1, 2]
TASK = request(2_000, 30, 1)


def choose(policy, spec=SPEC, req=TASK):
    cluster = make_state(spec)
    policy.attach(cluster)
    return pair(policy.select(cluster, req, cluster.feasible(req)))


def pair(choice: Choice) -> tuple[int, tuple[int, ...] | None]:
    assert choice.allocation is None  # the baselines and topoalloc leave the devices to the core
    return choice.node, choice.gpus


def test_pick_top_breaks_ties_by_rank() -> None:
    scores = np.array([5.0, 9.0, 9.0, 1.0])
    feasible = np.array([True, True, True, True])
    assert pick_top([scores], feasible, np.array([0, 3, 2, 1])) == 2
    assert pick_top([scores], np.array([True, False, False, True]), np.array([0, 3, 2, 1])) == 0


def test_bestfit_normalises_and_picks_the_tightest_node_and_gpu(rng: random.Random) -> None:
    # raw: n0 ⌊100(1 − ½·6/128 − ½·110/800)⌋ = 90, n1 15, n2 76 -> normalised 100, 0, 81
    assert choose(BestFitPolicy(RANK_N2_FIRST, rng)) == (0, (1,))


def test_dotprod_ties_go_to_the_lowest_rank(rng: random.Random) -> None:
    # n0 ⌊100(1 − 0.0075/2)⌋ = 99, n1 97, n2 ⌊100(1 − 0.0160/2)⌋ = 99: n0 and n2 tie
    assert choose(DotProdPolicy(RANK_N2_FIRST, rng)) == (2, (0,))  # best fit GPU: 70% free
    assert choose(DotProdPolicy(RANK_N0_FIRST, rng)) == (0, (1,))


def test_gpupacking_prefers_partly_used_gpus_with_least_free(rng: random.Random) -> None:
    # n0: GPU with 40% free -> 100 − 4 = 96; n2: 70% -> 93; n1 idle: 33 − 8 = 25
    assert choose(GpuPackingPolicy(RANK_N2_FIRST, rng)) == (0, (1,))
    whole = request(2_000, 100, 1)
    # whole GPU: partly used nodes 50 − 1 = 49 (n0 and n2 tie), idle n1 25; the core picks the GPU
    assert choose(GpuPackingPolicy(RANK_N2_FIRST, rng), req=whole) == (2, None)


def test_gpuclustering_bands_by_the_kinds_already_on_the_node(rng: random.Random) -> None:
    policy = GpuClusteringPolicy(RANK_N2_FIRST, rng)
    cluster = make_state(SPEC)
    # no kinds yet: band 25 + ⌊25(8000 − free milli)/8000⌋: n0 45, n1 25, n2 40
    assert pair(policy.select(cluster, TASK, cluster.feasible(TASK))) == (0, (1,))
    whole = request(2_000, 100, 1)
    # n0 now holds a sharing task: "other kinds" band 0 + 20 = 20; n2 idle band 40 wins
    assert policy.select(cluster, whole, cluster.feasible(whole)).node == 2


def test_random_picks_uniformly_among_feasible_nodes_and_fitting_gpus(rng: random.Random) -> None:
    policy = RandomPolicy(RANK_N0_FIRST, rng)
    seen = {choose(policy) for _ in range(300)}
    assert {node for node, _ in seen} == {0, 1, 2}
    assert all(gpu != (3,) for node, gpu in seen if node == 2)  # GPU 3 has 20% < 30% free


FGD_MIX = WorkloadMix((TaskShape(2_000, 30, 1), TaskShape(4_000, 100, 1)), (0.5, 0.5))


@pytest.mark.parametrize("rank", [RANK_N2_FIRST, RANK_N0_FIRST])
def test_fgd_places_where_fragmentation_grows_least(rank: list[int], rng: random.Random) -> None:
    # n0: F 20 -> 10 on GPU 1 (growth −10, score 52); n1: growth +35 (41);
    # n2: F 55 -> 40 on GPU 0 (growth −15, score 53)
    assert fgd_score(10.0) == 52 and fgd_score(-35.0) == 41 and fgd_score(15.0) == 53
    assert choose(FgdPolicy(rank, rng, FGD_MIX)) == (2, (0,))


def test_topoalloc_runs_the_production_scorer_and_allocates_the_gpu_it_scored(rng: random.Random) -> None:
    policy = TopoallocPolicy(RANK_N0_FIRST, rng, oracle_config(FGD_MIX))
    cluster = make_state(SPEC)
    policy.attach(cluster)
    assert pair(policy.select(cluster, TASK, cluster.feasible(TASK))) == (2, None)  # n2 as FGD
    (placed,) = cluster.place((TASK,), policy).placed  # the GPU comes from the core at bind
    # Koordinator's default device scoring (LeastAllocated) would take idle GPU 1; the
    # fragmentation term scored GPU 0 (70% free), and the bind path takes that one
    assert placed.node == 2 and placed.allocation.minors("gpu") == [0]
    assert GPUSummary.of(cluster.states[2]).free_pct == (40, 100, 100, 20)


def test_cached_scores_follow_node_changes(rng: random.Random) -> None:
    policy = FgdPolicy(RANK_N0_FIRST, rng, FGD_MIX)
    cluster = make_state(SPEC)
    assert pair(policy.select(cluster, TASK, cluster.feasible(TASK))) == (2, (0,))
    (placed,) = cluster.place((TASK,), policy).placed  # n2 -> [40, 100, 100, 20]: scores like n0 now
    assert (placed.node, placed.allocation.minors("gpu")) == (2, [0])
    second = request(2_000, 30, 1, name="second")
    chosen = pair(policy.select(cluster, second, cluster.feasible(second)))
    fresh_cluster = make_state([SPEC[0], SPEC[1], (32_000, 131_072, [40, 100, 100, 20], 18_000)])
    fresh = FgdPolicy(RANK_N0_FIRST, random.Random(1), FGD_MIX)
    assert chosen == pair(fresh.select(fresh_cluster, second, fresh_cluster.feasible(second)))
