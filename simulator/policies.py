"""Node-scoring policies for trace replay: the FGD paper's baselines, as its artifact implements them
(../shared/traces/openb/FGD-PROTOCOL.md §2, "Baseline policies as implemented"), and topoalloc's
production scorer.

A policy sees the simulated cluster (the core's NodeStates and its NodeTable columns), the
request and the feasible nodes, and returns the node and, for a shared pod, the GPU its rule
picks (a `Choice`); the cluster then has the core allocate there (taking that GPU) and assign.
The baselines break ties the artifact's way: the highest score wins, then the lowest seeded node
rank (its "lexicographically smallest renamed node"). `topoalloc` is the production path end to
end: the core's ranking (fine score, stable per-node tie key), its bind-time allocation with the
GPU the fragmentation term assumed, and a workload mix learned from the pods the cluster placed.

Policies whose score of a node depends only on that node's state and the task shape cache the
score per (task shape, node) and recompute only nodes whose state changed since (the
:class:`CachedPolicy` base), plus a memo keyed by node state, because at the start most nodes
are identical.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from allocator.core.scoring.device import DeviceScoring
from allocator.core.scoring.fragmentation import placement_options
from allocator.core.scoring.fragmentation_term import FragmentationSettings
from allocator.core.scoring.scorer import NodeScorer, ScoringConfig
from allocator.core.scoring.workload_mix import WorkloadMix
from simulator.cluster import FULL, Choice, Feasible, SimCluster, SimRequest

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


def gpus_for(cluster: SimCluster, node: int, req: SimRequest) -> tuple[int, ...] | None:
    """The baselines' in-node choice: best fit for a sharing task. Whole GPUs are left to the
    core (lowest free minors on nodes without topology, as the artifact takes them)."""
    if req.sharing:
        return (best_fit_gpu(cluster.free_pct(node), req.gpu_pct),)
    return None


class Policy:
    """A `Chooser`: the baselines let the core choose devices in Koordinator's Filter order
    (no device scoring), taking the GPU a shared pod's rule picked."""

    name = "policy"
    scoring: DeviceScoring | None = None
    scorer: NodeScorer | None = None

    def __init__(self, rank: Sequence[int], rng: random.Random) -> None:
        self.rank = np.asarray(rank, dtype=np.int64)
        self.rng = rng

    def attach(self, cluster: SimCluster) -> None:
        """Called once with the cluster before the first pod."""

    def select(self, cluster: SimCluster, req: SimRequest, feasible: Feasible) -> Choice:
        raise NotImplementedError


class RandomPolicy(Policy):
    """Uniform among feasible nodes; a sharing task goes to a uniform GPU among those that fit."""

    name = "random"

    def select(self, cluster: SimCluster, req: SimRequest, feasible: Feasible) -> Choice:
        cand = np.flatnonzero(feasible.mask)
        node = int(cand[self.rng.randrange(len(cand))])
        if req.sharing:
            fits = [i for i, f in enumerate(cluster.free_pct(node)) if f >= req.gpu_pct]
            return Choice(node, (fits[self.rng.randrange(len(fits))],))
        return Choice(node)


class DotProdPolicy(Policy):
    """Tetris-like: ⌊100·(1 − f·d / 2)⌋ with f, d = (CPU / 128 cores, GPU / 8 GPUs), free and
    requested. Fuller nodes give a smaller dot product and win."""

    name = "dotprod"

    def select(self, cluster: SimCluster, req: SimRequest, feasible: Feasible) -> Choice:
        dot = (cluster.cpu_free / MAX_SPEC_CPU) * (req.cpu_milli / MAX_SPEC_CPU) + (
            cluster.gpu_free_total / MAX_SPEC_GPU_PCT
        ) * (req.demand_pct / MAX_SPEC_GPU_PCT)
        score = np.floor(MAX_SCORE * (1.0 - dot / 2.0))
        node = pick_top([score], feasible.mask, self.rank)
        return Choice(node, gpus_for(cluster, node, req))


class BestFitPolicy(Policy):
    """100·(1 − ½·CPU left / 128 cores − ½·GPU left / 8 GPUs), truncated, then min-max normalised
    over the feasible nodes to an integer 0..100."""

    name = "bestfit"

    def select(self, cluster: SimCluster, req: SimRequest, feasible: Feasible) -> Choice:
        left = (cluster.cpu_free - req.cpu_milli) / MAX_SPEC_CPU * 0.5 + (
            cluster.gpu_free_total - req.demand_pct
        ) / MAX_SPEC_GPU_PCT * 0.5
        raw = np.trunc((1.0 - left) * MAX_SCORE).astype(np.int64)
        values = raw[feasible.mask]
        lo, hi = int(values.min()), int(values.max())
        score = (raw - lo) * MAX_SCORE // (hi - lo) if hi > lo else np.zeros_like(raw)
        node = pick_top([score], feasible.mask, self.rank)
        return Choice(node, gpus_for(cluster, node, req))


class GpuPackingPolicy(Policy):
    """Prefer (1) partly used GPUs, least free first, 50..100; (2) fresh GPUs on a partly used
    node, 33..50, fewer fresh GPUs better; (3) an idle node, 33 − its GPU count. CPU-only tasks
    score 0 everywhere."""

    name = "gpupacking"

    def select(self, cluster: SimCluster, req: SimRequest, feasible: Feasible) -> Choice:
        if req.gpu_count == 0:
            node = pick_top([np.zeros(cluster.size)], feasible.mask, self.rank)
            return Choice(node)
        idle_node = cluster.gpu_full_count == cluster.gpu_count
        score = np.where(idle_node, np.maximum(33 - cluster.gpu_count, cluster.gpu_count), 0)
        if req.sharing:
            m = cluster.gpu_matrix
            tightest = np.where(m >= req.gpu_pct, m, FULL + 1).min(axis=1)
            used = np.where(tightest == FULL, 49, np.maximum(100 - tightest // 10, 50))
        else:
            used = np.full(cluster.size, max(50 - req.gpu_count, 33))
        score = np.where(idle_node, score, used)
        node = pick_top([score], feasible.mask, self.rank)
        return Choice(node, gpus_for(cluster, node, req))


class GpuClusteringPolicy(Policy):
    """Cluster GPU tasks of one kind (sharing, 1-GPU, 2-GPU, ...) on the same nodes: nodes holding
    only that kind 75..100, mixed including it 50..75, idle 25..50, other kinds 0..25; within a
    band fuller nodes (less free GPU) score higher. CPU-only tasks score 0 everywhere."""

    name = "gpuclustering"

    def __init__(self, rank: Sequence[int], rng: random.Random) -> None:
        super().__init__(rank, rng)
        self._kinds: np.ndarray | None = None  # per node: bit set of the task kinds it holds

    @staticmethod
    def _kind_bit(req: SimRequest) -> int:
        return 1 if req.sharing else 1 << min(req.gpu_count, 30)

    def select(self, cluster: SimCluster, req: SimRequest, feasible: Feasible) -> Choice:
        if self._kinds is None:
            self._kinds = np.zeros(cluster.size, dtype=np.int64)
        if req.gpu_count == 0:
            node = pick_top([np.zeros(cluster.size)], feasible.mask, self.rank)
            return Choice(node)
        bit = self._kind_bit(req)
        kinds = self._kinds
        fullness = 25 * (8000 - 10 * cluster.gpu_free_total) // 8000
        band = np.where(
            kinds & bit,
            np.where(kinds == bit, 75, 50),
            np.where(kinds == 0, 25, 0),
        )
        node = pick_top([band + fullness], feasible.mask, self.rank)
        kinds[node] |= bit
        return Choice(node, gpus_for(cluster, node, req))


class CachedPolicy(Policy):
    """A policy whose node score depends only on the task shape and the node's model, free CPU and
    per-GPU free share: scores are cached per (shape, node) and recomputed for the nodes whose
    version changed, with a memo on those inputs."""

    n_keys = 1
    memo_limit = 400_000

    def __init__(self, rank: Sequence[int], rng: random.Random) -> None:
        super().__init__(rank, rng)
        self._cache: dict[int, tuple[np.ndarray, np.ndarray, list[tuple[int, ...] | None]]] = {}
        self._memo: dict[tuple, tuple[tuple[float, ...], tuple[int, ...] | None]] = {}

    def score_node(
        self, req: SimRequest, model: str, cpu_free: int, free: tuple[int, ...]
    ) -> tuple[tuple[float, ...], tuple[int, ...] | None]:
        """(score keys, higher is better; GPUs for a shared pod) for a feasible node of GPU model
        `model` with `cpu_free` milli-cores and per-GPU free share `free`."""
        raise NotImplementedError

    def select(self, cluster: SimCluster, req: SimRequest, feasible: Feasible) -> Choice:
        entry = self._cache.get(req.shape_id)
        if entry is None:
            entry = (
                np.full(cluster.size, -1, dtype=np.int64),
                np.zeros((self.n_keys, cluster.size)),
                [None] * cluster.size,
            )
            self._cache[req.shape_id] = entry
        seen, scores, gpus = entry
        mask = feasible.mask
        version = cluster.version
        stale = np.flatnonzero(mask & (seen != version))
        if len(stale):
            memo = self._memo
            if len(memo) > self.memo_limit:
                memo.clear()
            models, cpu_free, sid = cluster.models, cluster.cpu_free, req.shape_id
            for node in stale.tolist():
                model, cpu, free = models[node], int(cpu_free[node]), cluster.free_pct(node)
                key = (sid, model, cpu, free)
                hit = memo.get(key)
                if hit is None:
                    hit = memo[key] = self.score_node(req, model, cpu, free)
                scores[:, node] = hit[0]
                gpus[node] = hit[1]
            seen[stale] = version[stale]
        node = pick_top(list(scores), mask, self.rank)
        return Choice(node, gpus[node])


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
        self, req: SimRequest, model: str, cpu_free: int, free: tuple[int, ...]
    ) -> tuple[tuple[float, ...], tuple[int, ...] | None]:
        options = placement_options(free, cpu_free, req.shape, self.mix.compiled_for(model))
        best = max(options, key=lambda o: fgd_score(-o.growth))  # first max = lowest GPU index
        return (float(fgd_score(-best.growth)),), best.gpus if req.sharing else None


class TopoallocPolicy(Policy):
    """The production path: the core's NodeScorer (fragmentation term with a workload mix learned
    from the pods the cluster placed, plus the other configured components) ranks the feasible
    nodes, ties go to the core's stable per-node key, and the core allocates on the chosen node
    with the GPU the score assumed. The protocol's node rank is not used."""

    name = "topoalloc"

    def __init__(self, rank: Sequence[int], rng: random.Random, config: ScoringConfig | None = None) -> None:
        super().__init__(rank, rng)
        self.config = config or ScoringConfig()
        # The production bind path: the configured device scoring, the GPUs the scorer assumed.
        self.scorer = NodeScorer(self.config)
        self.scoring = self.config.device_scoring

    def attach(self, cluster: SimCluster) -> None:
        cluster.core.add_observer(self.scorer.observe)

    def select(self, cluster: SimCluster, req: SimRequest, feasible: Feasible) -> Choice:
        best = cluster.core.best(req.pod, feasible.names, self.scorer)
        if best is None:
            raise ValueError(f"{req.key}: no feasible node to rank")
        return Choice(cluster.index[best])


def oracle_config(mix: WorkloadMix, base: ScoringConfig | None = None) -> ScoringConfig:
    """A scoring config whose fragmentation term plans for a fixed mix (the trace's own, an
    oracle no production system has): the prior outweighs anything learned, and coverage 1
    keeps the already-cut mix from being cut again. For research comparisons only."""
    base = base or ScoringConfig()
    settings = FragmentationSettings(
        prior=tuple(zip(mix.shapes, mix.weights, strict=True)), prior_weight=1e12, coverage=1.0
    )
    return replace(base, fragmentation=settings)
