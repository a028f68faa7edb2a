"""Node-scoring policies for trace replay: the FGD paper's baselines, as its artifact implements them
(../shared/traces/openb/FGD-PROTOCOL.md §2, "Baseline policies as implemented").

A policy sees the cluster state, the request and the mask of feasible nodes, and returns the node
and the GPUs to use. Every policy breaks ties the same way: the highest score wins, then the lowest
seeded node rank (the artifact's "lexicographically smallest renamed node").

Policies whose score of a node depends only on that node's state and the task shape cache the
score per (task shape, node) and recompute only nodes whose state changed since (the
:class:`CachedPolicy` base), plus a memo keyed by node state, because at the start most nodes
are identical.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import numpy as np

from allocator.core.scoring.fragmentation import placement_options, score_node, whole_gpu_pick
from allocator.core.scoring.workload_mix import DEFAULT_COVERAGE, OnlineMix, WorkloadMix
from simulator.cluster import FULL, ClusterState, Request

MAX_SPEC_CPU = 128_000.0  # milli-cores, the artifact's normalisation constants
MAX_SPEC_GPU_PCT = 800.0  # 8 GPUs, in percent (8000 milli)
MAX_SCORE = 100


def pick_top(scores: Sequence[np.ndarray], feasible: np.ndarray, rank: np.ndarray) -> int:
    """The feasible node with the lexicographically highest scores; ties go to the lowest rank."""
    cand = np.flatnonzero(feasible)
    for score in scores:
        if len(cand) == 1:
            break
        values = score[cand]
        cand = cand[values == values.max()]
    if len(cand) == 1:
        return int(cand[0])
    return int(cand[np.argmin(rank[cand])])


def best_fit_gpu(free: Sequence[int], need: int) -> int:
    """The GPU with the least free share that still holds ``need`` (ties: lowest index)."""
    best = -1
    for i, f in enumerate(free):
        if f >= need and (best < 0 or f < free[best]):
            best = i
    if best < 0:
        raise ValueError(f"no GPU with {need}% free in {list(free)}")
    return best


def gpus_for(state: ClusterState, node: int, req: Request) -> tuple[int, ...]:
    """The default in-node choice: lowest-index fully free GPUs, best fit for a sharing task."""
    if req.gpu_count == 0:
        return ()
    if req.sharing:
        return (best_fit_gpu(state.gpus[node], req.gpu_pct),)
    picked = whole_gpu_pick(state.gpus[node], req.gpu_count)
    if picked is None:
        raise ValueError(f"node {node} has fewer than {req.gpu_count} free GPUs")
    return picked


class Policy:
    name = "policy"

    def __init__(self, rank: Sequence[int], rng: random.Random) -> None:
        self.rank = np.asarray(rank, dtype=np.int64)
        self.rng = rng

    def select(self, state: ClusterState, req: Request, feasible: np.ndarray) -> tuple[int, tuple[int, ...]]:
        raise NotImplementedError

    def observe(self, req: Request) -> None:
        """Called for every arriving request (placed or not), before ``select``."""


class RandomPolicy(Policy):
    """Uniform among feasible nodes; a sharing task goes to a uniform GPU among those that fit."""

    name = "random"

    def select(self, state: ClusterState, req: Request, feasible: np.ndarray) -> tuple[int, tuple[int, ...]]:
        cand = np.flatnonzero(feasible)
        node = int(cand[self.rng.randrange(len(cand))])
        if req.sharing:
            fits = [i for i, f in enumerate(state.gpus[node]) if f >= req.gpu_pct]
            return node, (fits[self.rng.randrange(len(fits))],)
        return node, gpus_for(state, node, req)


class DotProdPolicy(Policy):
    """Tetris-like: ⌊100·(1 − f·d / 2)⌋ with f, d = (CPU / 128 cores, GPU / 8 GPUs), free and
    requested. Fuller nodes give a smaller dot product and win."""

    name = "dotprod"

    def select(self, state: ClusterState, req: Request, feasible: np.ndarray) -> tuple[int, tuple[int, ...]]:
        dot = (state.cpu_free / MAX_SPEC_CPU) * (req.cpu_milli / MAX_SPEC_CPU) + (
            state.gpu_free_total / MAX_SPEC_GPU_PCT
        ) * (req.demand_pct / MAX_SPEC_GPU_PCT)
        score = np.floor(MAX_SCORE * (1.0 - dot / 2.0))
        node = pick_top([score], feasible, self.rank)
        return node, gpus_for(state, node, req)


class BestFitPolicy(Policy):
    """100·(1 − ½·CPU left / 128 cores − ½·GPU left / 8 GPUs), truncated, then min-max normalised
    over the feasible nodes to an integer 0..100."""

    name = "bestfit"

    def select(self, state: ClusterState, req: Request, feasible: np.ndarray) -> tuple[int, tuple[int, ...]]:
        left = (state.cpu_free - req.cpu_milli) / MAX_SPEC_CPU * 0.5 + (
            state.gpu_free_total - req.demand_pct
        ) / MAX_SPEC_GPU_PCT * 0.5
        raw = np.trunc((1.0 - left) * MAX_SCORE).astype(np.int64)
        values = raw[feasible]
        lo, hi = int(values.min()), int(values.max())
        score = (raw - lo) * MAX_SCORE // (hi - lo) if hi > lo else np.zeros_like(raw)
        node = pick_top([score], feasible, self.rank)
        return node, gpus_for(state, node, req)


class GpuPackingPolicy(Policy):
    """Prefer (1) partly used GPUs, least free first, 50..100; (2) fresh GPUs on a partly used
    node, 33..50, fewer fresh GPUs better; (3) an idle node, 33 − its GPU count. CPU-only tasks
    score 0 everywhere."""

    name = "gpupacking"

    def select(self, state: ClusterState, req: Request, feasible: np.ndarray) -> tuple[int, tuple[int, ...]]:
        if req.gpu_count == 0:
            node = pick_top([np.zeros(state.size)], feasible, self.rank)
            return node, ()
        idle_node = state.gpu_full_count == state.gpu_count
        score = np.where(idle_node, np.maximum(33 - state.gpu_count, state.gpu_count), 0)
        if req.sharing:
            m = state.gpu_matrix
            tightest = np.where(m >= req.gpu_pct, m, FULL + 1).min(axis=1)
            used = np.where(tightest == FULL, 49, np.maximum(100 - tightest // 10, 50))
        else:
            used = np.full(state.size, max(50 - req.gpu_count, 33))
        score = np.where(idle_node, score, used)
        node = pick_top([score], feasible, self.rank)
        return node, gpus_for(state, node, req)


class GpuClusteringPolicy(Policy):
    """Cluster GPU tasks of one kind (sharing, 1-GPU, 2-GPU, ...) on the same nodes: nodes holding
    only that kind 75..100, mixed including it 50..75, idle 25..50, other kinds 0..25; within a
    band fuller nodes (less free GPU) score higher. CPU-only tasks score 0 everywhere."""

    name = "gpuclustering"

    def __init__(self, rank: Sequence[int], rng: random.Random) -> None:
        super().__init__(rank, rng)
        self._kinds: np.ndarray | None = None  # per node: bit set of the task kinds it holds

    @staticmethod
    def _kind_bit(req: Request) -> int:
        return 1 if req.sharing else 1 << min(req.gpu_count, 30)

    def select(self, state: ClusterState, req: Request, feasible: np.ndarray) -> tuple[int, tuple[int, ...]]:
        if self._kinds is None:
            self._kinds = np.zeros(state.size, dtype=np.int64)
        if req.gpu_count == 0:
            node = pick_top([np.zeros(state.size)], feasible, self.rank)
            return node, ()
        bit = self._kind_bit(req)
        kinds = self._kinds
        fullness = 25 * (8000 - 10 * state.gpu_free_total) // 8000
        band = np.where(
            kinds & bit,
            np.where(kinds == bit, 75, 50),
            np.where(kinds == 0, 25, 0),
        )
        node = pick_top([band + fullness], feasible, self.rank)
        kinds[node] |= bit
        return node, gpus_for(state, node, req)


class CachedPolicy(Policy):
    """A policy whose node score depends only on (node state, task shape): scores are cached per
    (shape, node) and recomputed for the nodes whose version changed, with a memo on node state."""

    n_keys = 1
    memo_limit = 400_000

    def __init__(self, rank: Sequence[int], rng: random.Random) -> None:
        super().__init__(rank, rng)
        self._cache: dict[int, tuple[np.ndarray, np.ndarray, list[tuple[int, ...]]]] = {}
        self._memo: dict[tuple, tuple[tuple[float, ...], tuple[int, ...]]] = {}

    def score_node(
        self, state: ClusterState, node: int, req: Request
    ) -> tuple[tuple[float, ...], tuple[int, ...]]:
        """(score keys, higher is better; GPUs to use) for a feasible node."""
        raise NotImplementedError

    def memo_key(self, state: ClusterState, node: int, req: Request) -> tuple:
        return (req.shape_id, state.models[node], int(state.cpu_free[node]), tuple(state.gpus[node]))

    def select(self, state: ClusterState, req: Request, feasible: np.ndarray) -> tuple[int, tuple[int, ...]]:
        entry = self._cache.get(req.shape_id)
        if entry is None:
            entry = (
                np.full(state.size, -1, dtype=np.int64),
                np.zeros((self.n_keys, state.size)),
                [()] * state.size,
            )
            self._cache[req.shape_id] = entry
        seen, scores, gpus = entry
        stale = np.flatnonzero(feasible & (seen != state.version))
        if len(stale):
            memo = self._memo
            if len(memo) > self.memo_limit:
                memo.clear()
            for node in stale.tolist():
                key = self.memo_key(state, node, req)
                hit = memo.get(key)
                if hit is None:
                    hit = memo[key] = self.score_node(state, node, req)
                scores[:, node] = hit[0]
                gpus[node] = hit[1]
            seen[stale] = state.version[stale]
        node = pick_top(list(scores), feasible, self.rank)
        return node, gpus[node]


def fgd_score(delta_pct: float) -> int:
    """The artifact's ⌊100·σ(Δ/1000)⌋ with Δ in milli-GPU (= Δ/100 in GPU percent)."""
    x = delta_pct / 100.0
    if x < -700:
        return 0
    return int(MAX_SCORE / (1.0 + math.exp(-x)))


class FgdPolicy(CachedPolicy):
    """FGD: place where the node's fragmentation (w.r.t. the target workload) grows least, scored
    ⌊100·σ(−growth)⌋; a sharing task takes the GPU with the best such score (ties: lowest index)."""

    name = "fgd"

    def __init__(self, rank: Sequence[int], rng: random.Random, mix: WorkloadMix) -> None:
        super().__init__(rank, rng)
        self.mix = mix

    def score_node(
        self, state: ClusterState, node: int, req: Request
    ) -> tuple[tuple[float, ...], tuple[int, ...]]:
        options = placement_options(
            state.gpus[node], int(state.cpu_free[node]), req.shape, self.mix.compiled_for(state.models[node])
        )
        best = max(options, key=lambda o: fgd_score(-o.growth))  # first max = lowest GPU index
        return (float(fgd_score(-best.growth)),), best.gpus


class TopoallocPolicy(CachedPolicy):
    """The production fragmentation scorer (allocator.core.scoring.fragmentation.score_node) with a
    workload mix learned online from the pods seen so far (no oracle): FGD's growth score, then
    the stable node order."""

    name = "topoalloc"

    def __init__(
        self,
        rank: Sequence[int],
        rng: random.Random,
        prior: WorkloadMix | None = None,
        window: int = 1000,
        refresh_every: int = 200,
        prior_weight: float = 500.0,
        coverage: float = DEFAULT_COVERAGE,
    ) -> None:
        super().__init__(rank, rng)
        self.online = OnlineMix(
            prior, window=window, refresh_every=refresh_every, prior_weight=prior_weight, coverage=coverage
        )
        self.mix = self.online.mix()

    def observe(self, req: Request) -> None:
        self.online.observe(req.shape)
        mix = self.online.mix()
        if mix is not self.mix:  # new mix: every cached score is stale
            self.mix = mix
            self._cache.clear()
            self._memo.clear()

    def score_node(
        self, state: ClusterState, node: int, req: Request
    ) -> tuple[tuple[float, ...], tuple[int, ...]]:
        result = score_node(
            state.gpus[node], int(state.cpu_free[node]), state.models[node], req.shape, self.mix
        )
        if result is None:  # cannot happen for a feasible node
            raise ValueError(f"{req.name} does not fit node {node} that passed the filter")
        return (float(result.score),), result.gpus
