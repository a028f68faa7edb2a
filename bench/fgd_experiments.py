"""Research harness: variants of the fragmentation scorer on the FGD paper protocol.

    .venv/bin/python bench/fgd_experiments.py VARIANT[,VARIANT...] [--trace default] [--seeds 42-46]

Each variant is a name from ``VARIANTS`` (see ``--list``). Prints unallocated GPU % at 100% arrived,
mean ± SD over the seeds, per variant, and the per-seed values. Runs on two processes.
Research only: the winner lives in allocator/core/scoring/fragmentation.py.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

import simulator.policies as sim_policies
from allocator.core.scoring.workload_mix import DEFAULT_COVERAGE
from simulator.cluster import FULL, ClusterState, Request, to_requests
from simulator.engine import POLICIES, replay
from simulator.metrics import curves
from simulator.openb import OpenbPod, load_nodes, load_pods, resolve_trace
from simulator.policies import CachedPolicy, Policy
from simulator.protocol import paper_setup, parse_seeds, target_workload

# ---------------------------------------------------------------- mixes with memory

Key = tuple[int, int, int, int, tuple[str, ...]]  # cpu, memory, gpu_pct, gpu_count, models


def fgd_key(k: Key) -> tuple:
    return (k[0], k[2], k[3], k[4])


def mix_from_counts(
    counts: Counter, coverage: float = DEFAULT_COVERAGE, by_memory: bool = False, weighting: str = "count"
) -> dict[Key, float]:
    """FGD's cut (most frequent shapes covering ``coverage``), shapes grouped without memory,
    each kept shape's weight split over the memory values seen with it (``by_memory``) or given
    to the largest memory seen (not by_memory: memory 0 so it never binds)."""
    grouped: dict[tuple, Counter] = {}
    for k, c in counts.items():
        grouped.setdefault(fgd_key(k), Counter())[k[1]] += c
    total = sum(counts.values())
    ranked = sorted(grouped.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))
    kept = []
    covered = 0
    for fk, mems in ranked:
        kept.append((fk, mems))
        covered += sum(mems.values())
        if covered >= coverage * total - 1e-9:
            break
    out: dict[Key, float] = {}
    if weighting == "gpu":  # weight by GPU demand instead of task count
        kept = [(fk, Counter({m: c * fk[1] * fk[2] for m, c in mems.items()})) for fk, mems in kept]
        covered = sum(sum(m.values()) for _, m in kept)
    for (cpu, pct, cnt, models), mems in kept:
        if by_memory:
            for mem, c in mems.items():
                out[(cpu, mem, pct, cnt, models)] = c / covered
        else:
            out[(cpu, 0, pct, cnt, models)] = sum(mems.values()) / covered
    return out


def pod_key(p: OpenbPod | Request) -> Key:
    if isinstance(p, Request):
        return (p.cpu_milli, p.memory_mib, p.gpu_pct, p.gpu_count, p.models)
    s = p.shape()
    return (p.cpu_milli, p.memory_mib, s.gpu_pct, s.gpu_count, s.gpu_models)


@dataclass
class Compiled:
    """Per GPU model: groups (gpu_pct, gpu_count) -> members (cpu, mem, weight)."""

    groups: list[tuple[int, int, list[tuple[int, int, float]]]]


def compile_mix(mix: dict[Key, float], model: str) -> Compiled:
    by: dict[tuple[int, int], list] = {}
    for (cpu, mem, pct, cnt, models), w in mix.items():
        if cnt == 0 or (models and model not in models):
            continue
        by.setdefault((pct, cnt), []).append((cpu, mem, w))
    return Compiled([(p, c, sorted(m)) for (p, c), m in sorted(by.items())])


def fragment(free: Sequence[int], cpu: int, mem: int, comp: Compiled) -> float:
    idle = sum(free)
    if idle == 0:
        return 0.0
    usable = 0.0
    for pct, cnt, members in comp.groups:
        w = 0.0
        for c, m, wm in members:
            if c > cpu:
                break
            if m <= mem:
                w += wm
        if w == 0.0:
            continue
        count = share = 0
        for f in free:
            if f >= pct:
                count += 1
                share += f
        if count >= cnt:
            usable += w * share
    return idle - usable


def fragment_k(free: Sequence[int], cpu: int, mem: int, comp: Compiled, k: float) -> float:
    """Σ_g f_g · (1 − u_g)^k, u_g = weight of the mix that could use GPU g's free share on this
    node. k = 1 is FGD exactly; larger k looks further ahead (the chance that none of the next k
    tasks could use the share)."""
    idle = sum(free)
    if idle == 0:
        return 0.0
    u = [0.0] * len(free)
    for pct, cnt, members in comp.groups:
        w = 0.0
        for c, m, wm in members:
            if c > cpu:
                break
            if m <= mem:
                w += wm
        if w == 0.0:
            continue
        if sum(1 for f in free if f >= pct) >= cnt:
            for i, f in enumerate(free):
                if f >= pct:
                    u[i] += w
    return sum(f * max(0.0, 1.0 - ui) ** k for f, ui in zip(free, u, strict=False) if f)


_DP_MEMO: dict = {}


def waste_table(shares: tuple[tuple[int, float], ...], k: float) -> list[float]:
    """V[f], f = 0..99: expected share of a free f that is never used, if the hole is filled by
    the fitting tasks of the mix in proportion to their weight, and stays empty with
    probability (1 − u)^k (u = weight of the tasks that fit)."""
    key = (shares, k)
    hit = _DP_MEMO.get(key)
    if hit is not None:
        return hit
    v = [0.0] * 100
    for f in range(1, 100):
        u = 0.0
        acc = 0.0
        for pct, w in shares:
            if pct <= f:
                u += w
                acc += w * v[f - pct]
        if u <= 0.0:
            v[f] = float(f)
            continue
        stay = max(0.0, 1.0 - u) ** k
        v[f] = stay * f + (1.0 - stay) * acc / u
    _DP_MEMO[key] = v
    return v


def best_of_k(options: list[tuple[float, float]], f: float, k: float) -> float:
    """E[min value] when the hole takes the best of the next k draws: ``options`` are
    (value after fill, probability of the shape) for the fitting shapes; no fitting draw -> f."""
    options.sort()
    left = 1.0
    prev = 1.0
    out = 0.0
    for value, p in options:
        left -= p
        nxt = max(0.0, left) ** k
        out += (prev - nxt) * value
        prev = nxt
    return out + prev * f


def waste_table_best(shares: tuple[tuple[int, float], ...], k: float) -> list[float]:
    key = ("best", shares, k)
    hit = _DP_MEMO.get(key)
    if hit is not None:
        return hit
    v = [0.0] * 100
    for f in range(1, 100):
        v[f] = best_of_k([(v[f - pct], w) for pct, w in shares if pct <= f], float(f), k)
    _DP_MEMO[key] = v
    return v


def fragment_best(free: Sequence[int], cpu: int, mem: int, comp: Compiled, k: float) -> float:
    idle = sum(free)
    if idle == 0:
        return 0.0
    shares = []
    whole = 0.0
    n_full = sum(1 for f in free if f >= 100)
    for pct, cnt, members in comp.groups:
        w = 0.0
        for c, m, wm in members:
            if c > cpu:
                break
            if m <= mem:
                w += wm
        if w == 0.0:
            continue
        if pct < 100:
            shares.append((pct, w))
        elif cnt <= n_full:
            whole += w
    v = waste_table_best(tuple(shares), k)
    total = 0.0
    fresh = None
    for f in free:
        if f == 0:
            continue
        if f < 100:
            total += v[f]
            continue
        if fresh is None:
            opts = [(v[100 - pct], w) for pct, w in shares]
            if whole:
                opts.append((0.0, whole))
            fresh = best_of_k(opts, 100.0, k)
        total += fresh
    return total


def fragment_dp(free: Sequence[int], cpu: int, mem: int, comp: Compiled, k: float) -> float:
    idle = sum(free)
    if idle == 0:
        return 0.0
    shares = []
    whole = 0.0
    n_full = sum(1 for f in free if f >= 100)
    for pct, cnt, members in comp.groups:
        w = 0.0
        for c, m, wm in members:
            if c > cpu:
                break
            if m <= mem:
                w += wm
        if w == 0.0:
            continue
        if pct < 100:
            shares.append((pct, w))
        elif cnt <= n_full:
            whole += w
    v = waste_table(tuple(shares), k)
    total = 0.0
    for f in free:
        if f == 0:
            continue
        if f < 100:
            total += v[f]
            continue
        u = whole
        acc = 0.0
        for pct, w in shares:
            u += w
            acc += w * v[100 - pct]
        if u <= 0:
            total += 100.0
            continue
        stay = max(0.0, 1.0 - u) ** k
        total += stay * 100 + (1.0 - stay) * acc / u
    return total


# ---------------------------------------------------------------- scores


def fgd_points(growth: float) -> int:
    x = -growth / 100.0
    if x < -700:
        return 0
    return min(int(100.0 / (1.0 + math.exp(-x))), 99)


ScoreFn = Callable[[float], float]


def step(s: float) -> ScoreFn:
    return lambda g: -math.floor(g / s + 0.5)


SCORES: dict[str, ScoreFn] = {"fgd": fgd_points, "exact": lambda g: -g}


# ---------------------------------------------------------------- the experimental policy


@dataclass
class Params:
    mix: str = "trace"  # trace (FGD's M, an oracle) | online
    memory: bool = False  # memory-aware fit in the fragmentation measure
    score: str = "fgd"
    window: int = 1000
    refresh: int = 200
    coverage: float = DEFAULT_COVERAGE
    weighting: str = "count"
    extra: dict = field(default_factory=dict)


class ExpPolicy(CachedPolicy):
    def __init__(self, setup, trace_pods: Sequence[OpenbPod], params: Params) -> None:
        super().__init__(setup.node_rank, setup.rng)
        self.p = params
        self.score_fn = SCORES[params.score] if params.score in SCORES else step(float(params.score))
        self.k_now = params.extra.get("k", 1)
        self.n_keys = 2 if params.extra.get("pair") or params.extra.get("split") else 1
        self._compiled: dict[str, Compiled] = {}
        self.recent: list[Key] = []
        self.counts: Counter = Counter()
        self.since = 0
        if params.mix == "trace":
            self.mix = mix_from_counts(
                Counter(pod_key(p) for p in trace_pods), params.coverage, params.memory, params.weighting
            )
        else:
            self.mix = {}

    def memo_key(self, state: ClusterState, node: int, req: Request) -> tuple:
        return (
            req.shape_id,
            req.memory_mib,
            state.models[node],
            int(state.cpu_free[node]),
            int(state.mem_free[node]) if self.p.memory else 0,
            tuple(state.gpus[node]),
        )

    def observe(self, req: Request) -> None:
        if self.p.mix != "online":
            return
        k = pod_key(req)
        self.recent.append(k)
        self.counts[k] += 1
        if len(self.recent) > self.p.window:
            old = self.recent[len(self.recent) - self.p.window - 1]
            self.counts[old] -= 1
            if not self.counts[old]:
                del self.counts[old]
        self.since += 1
        # refresh geometrically while the window fills (1, 2, 4, ... pods), then every `refresh`
        freeze = self.p.extra.get("freeze")
        if freeze is not None and len(self.recent) > freeze:
            return
        if not self.mix or self.since >= min(self.p.refresh, max(1, len(self.recent) // 2)):
            self.since = 0
            self.mix = mix_from_counts(self.counts, self.p.coverage, self.p.memory, self.p.weighting)
            self._compiled.clear()
            self._cache.clear()
            self._memo.clear()

    def comp(self, model: str) -> Compiled:
        c = self._compiled.get(model)
        if c is None:
            c = self._compiled[model] = compile_mix(self.mix, model)
        return c

    def options(self, state: ClusterState, node: int, req: Request) -> list[tuple[tuple[int, ...], float]]:
        free = state.gpus[node]
        cpu = int(state.cpu_free[node])
        mem = int(state.mem_free[node]) if self.p.memory else 1 << 60
        comp = self.comp(state.models[node])
        k = self.k_now
        scale = self.p.extra.get("scale", 1.0)
        if self.p.extra.get("best"):

            def frag(free, cpu, mem, comp):
                return fragment_best(free, cpu, mem, comp, k) * scale
        elif self.p.extra.get("dp"):

            def frag(free, cpu, mem, comp):
                return fragment_dp(free, cpu, mem, comp, k) * scale
        elif k == 1:
            frag = fragment
        else:

            def frag(free, cpu, mem, comp):
                return fragment_k(free, cpu, mem, comp, k) * scale

        before = frag(free, cpu, mem, comp)
        if self.p.extra.get("center") and req.gpu_count:
            # consuming GPU share is neutral: add back what a fresh GPU is worth on this node
            before -= frag([FULL], cpu, mem, comp) * req.demand_pct / FULL
        cpu2, mem2 = cpu - req.cpu_milli, mem - (req.memory_mib if self.p.memory else 0)
        if req.gpu_count == 0:
            return [((), frag(free, cpu2, mem2, comp) - before)]
        if req.gpu_pct == FULL:
            picked = tuple(i for i, f in enumerate(free) if f == FULL)[: req.gpu_count]
            after = list(free)
            for i in picked:
                after[i] = 0
            return [(picked, frag(after, cpu2, mem2, comp) - before)]
        out = []
        seen = set()
        after = list(free)
        for i, f in enumerate(free):
            if f < req.gpu_pct or f in seen:
                continue
            seen.add(f)
            after[i] = f - req.gpu_pct
            out.append(((i,), frag(after, cpu2, mem2, comp) - before))
            after[i] = f
        return out

    def canonical(self, model: str) -> list[float]:
        """The hole-waste table of the whole mix on this model (no CPU/memory filter)."""
        key = ("canon", model, self.k_now)
        hit = self._compiled.get(key)
        if hit is None:
            comp = self.comp(model)
            shares = tuple(
                (pct, sum(w for _, _, w in members)) for pct, cnt, members in comp.groups if pct < 100
            )
            k = self.p.extra.get("pk", self.k_now)
            hit = self._compiled[key] = [*waste_table_best(shares, k), 0.0]
        return hit

    def rejecting(self, model: str) -> float:
        """Weight of the mix's GPU tasks that cannot use this model."""
        key = ("reject", model)
        hit = self._compiled.get(key)
        if hit is None:
            hit = self._compiled[key] = sum(
                w for (_, _, _, cnt, models), w in self.mix.items() if cnt and models and model not in models
            )
        return hit

    def canon_delta(self, state: ClusterState, node: int, req: Request, gpus: tuple[int, ...]) -> float:
        """Growth of the canonical hole waste on the GPUs the task takes (node-independent)."""
        if not req.gpu_count:
            return 0.0
        v = self.canonical(state.models[node])
        free = state.gpus[node]
        return sum(v[free[g] - req.gpu_pct] - v[free[g]] for g in gpus)

    def score_node(self, state: ClusterState, node: int, req: Request):
        opts = self.options(state, node, req)
        if self.p.extra.get("split"):
            # (coarse node effect, exact canonical pairing, GPU index)
            q = self.score_fn
            scored = []
            reserve = self.p.extra.get("reserve", 0.0) * self.rejecting(state.models[node]) * req.demand_pct
            ltol = self.p.extra.get("ltol")
            for gpus, growth in opts:
                c = self.canon_delta(state, node, req, gpus)
                k0 = -(growth - c - reserve) if ltol is not None else q(growth - c - reserve)
                scored.append(((k0, -c, [-g for g in gpus]), gpus))
            if ltol is not None and ltol < 0:
                rounded = [math.floor(k[0] / -ltol + 0.5) for k, _ in scored]
                top = max(rounded)
                scored = [t for t, r in zip(scored, rounded, strict=False) if r == top]
                key, gpus = max(scored, key=lambda t: t[0][1:])
            elif ltol is not None:
                top = max(k[0] for k, _ in scored)
                scored = [t for t in scored if t[0][0] >= top - ltol]
                key, gpus = max(scored, key=lambda t: t[0][1:])
            else:
                key, gpus = max(scored, key=lambda t: t[0])
            return (float(key[0]), key[1]), gpus
        if self.p.extra.get("pair") and req.sharing:
            v = self.canonical(state.models[node])
            free = state.gpus[node]
            best = max(
                opts,
                key=lambda o: (
                    self.score_fn(o[1]),
                    v[free[o[0][0]]] - v[free[o[0][0]] - req.gpu_pct],
                    -o[0][0],
                ),
            )
            g = best[0][0]
            if self.p.extra.get("pairfirst"):
                best = max(
                    opts,
                    key=lambda o: (
                        v[free[o[0][0]]] - v[free[o[0][0]] - req.gpu_pct],
                        self.score_fn(o[1]),
                        -o[0][0],
                    ),
                )
                g = best[0][0]
                return (v[free[g]] - v[free[g] - req.gpu_pct], float(self.score_fn(best[1]))), best[0]
            return (float(self.score_fn(best[1])), v[free[g]] - v[free[g] - req.gpu_pct]), best[0]
        if self.p.extra.get("pair"):
            best = max(opts, key=lambda o: (self.score_fn(o[1]), [-g for g in o[0]]))
            if self.p.extra.get("pairfirst"):
                return (0.0, float(self.score_fn(best[1]))), best[0]
            return (float(self.score_fn(best[1])), 0.0), best[0]
        best = max(opts, key=lambda o: (self.score_fn(o[1]), [-g for g in o[0]]))
        if self.tol is not None:  # keep the raw growth; select() applies the tolerance
            return (-best[1],), best[0]
        return (float(self.score_fn(best[1])),), best[0]

    @property
    def tol(self):
        return self.p.extra.get("tol")


_plain_pick_top = sim_policies.pick_top
_LTOL: list[float | None] = [None]
_ADJ: list = [None]  # per-node addition to key 0 (model pressure), set around a select
_TOL: list[float | None] = [None]


def _pick_top_tol(scores, feasible, rank):
    """With a tolerance set: among feasible nodes whose first key is within tol of the best,
    the lowest rank (first fit among near-best nodes)."""
    ltol = _LTOL[0]
    if ltol is not None and ltol < 0:  # rounding mode: round((key0 + adj) / -ltol), then key 1, then rank
        cand = np.flatnonzero(feasible)
        v0 = scores[0][cand]
        if _ADJ[0] is not None:
            v0 = v0 + _ADJ[0][cand]
        v0 = np.floor(v0 / -ltol + 0.5)
        cand = cand[v0 == v0.max()]
        v1 = scores[1][cand]
        cand = cand[v1 >= v1.max() - 1e-9]
        return int(cand[np.argmin(rank[cand])])
    if ltol is not None:  # key 0 within ltol of the best, then key 1 exact, then rank
        cand = np.flatnonzero(feasible)
        v0 = scores[0][cand]
        if _ADJ[0] is not None:
            v0 = v0 + _ADJ[0][cand]
        cand = cand[v0 >= v0.max() - ltol]
        v1 = scores[1][cand]
        cand = cand[v1 >= v1.max() - 1e-9]
        return int(cand[np.argmin(rank[cand])])
    tol = _TOL[0]
    if tol is None:
        return _plain_pick_top(scores, feasible, rank)
    cand = np.flatnonzero(feasible)
    values = scores[0][cand]
    cand = cand[values >= values.max() - tol]
    return int(cand[np.argmin(rank[cand])])


sim_policies.pick_top = _pick_top_tol


class TolPolicy(ExpPolicy):
    def pressure(self, state: ClusterState) -> np.ndarray:
        """Per node: how much of its model's idle GPU the constrained tasks of the mix are
        expected to need (0..1), from cluster idle per model."""
        if not hasattr(self, "_model_idx"):
            names = sorted(set(state.models))
            self._model_names = names
            self._model_idx = np.array([names.index(m) for m in state.models])
        idle_by_model = np.bincount(
            self._model_idx, weights=state.gpu_free_total, minlength=len(self._model_names)
        )
        idle = {m: float(idle_by_model[i]) for i, m in enumerate(self._model_names)}
        total_idle = sum(idle.values())
        demand = sum(w * k[2] * k[3] for k, w in self.mix.items())
        need = dict.fromkeys(idle, 0.0)
        for (_, _, pct, cnt, models), w in self.mix.items():
            if not cnt or not models:
                continue
            accepted = [m for m in models if m in idle]
            pool = sum(idle[m] for m in accepted)
            if pool <= 0:
                continue
            d = w * pct * cnt / demand * total_idle  # expected future demand of this shape
            for m in accepted:
                need[m] += d * idle[m] / pool
        rho = np.array([min(1.0, need[m] / idle[m]) if idle[m] > 0 else 1.0 for m in self._model_names])
        return rho[self._model_idx]

    def select(self, state, req, feasible):
        phi = self.p.extra.get("phi")
        if phi:
            idle = float(state.gpu_free_total.sum()) / state.capacity_pct
            k = max(self.p.extra.get("kmin", 1.0), round(self.p.extra["k"] * min(1.0, idle / phi)))
            if k != self.k_now:
                self.k_now = k
                self._cache.clear()
                self._memo.clear()
        _TOL[0] = self.tol
        _LTOL[0] = self.p.extra.get("ltol")
        pr = self.p.extra.get("pressure")
        if pr and req.gpu_count:
            _ADJ[0] = -pr * req.demand_pct * self.pressure(state)
        try:
            return CachedPolicy.select(self, state, req, feasible)
        finally:
            _TOL[0] = None
            _LTOL[0] = None
            _ADJ[0] = None


# ---------------------------------------------------------------- variants

VariantFactory = Callable[[object, Sequence[OpenbPod], object], Policy]


def exp(**kw) -> VariantFactory:
    cls = TolPolicy if {"tol", "ltol"} & set(kw.get("extra", {})) else ExpPolicy
    return lambda setup, pods, mix: cls(setup, pods, Params(**kw))


VARIANTS: dict[str, VariantFactory] = {
    "fgd": lambda setup, pods, mix: POLICIES["fgd"](setup, mix),
    "topoalloc": lambda setup, pods, mix: POLICIES["topoalloc"](setup, mix),
    "x-fgd": exp(),
    "x-mem": exp(memory=True),
    "x-online": exp(mix="online"),
    "x-online-mem": exp(mix="online", memory=True),
    "x-mem-cov1": exp(memory=True, coverage=1.0),
    "x-mem-gpuw": exp(memory=True, weighting="gpu"),
    "x-mem-exact": exp(memory=True, score="exact"),
    "x-mem-s4": exp(memory=True, score="4"),
    "x-mem-s8": exp(memory=True, score="8"),
    "x-mem-s12": exp(memory=True, score="12"),
    "x-mem-s20": exp(memory=True, score="20"),
    **{f"x-mem-k{k}": exp(memory=True, extra={"k": k}) for k in (1, 2, 3, 5, 8, 12, 20)},
    **{
        f"x-mem-k{k}-x{sc}": exp(memory=True, extra={"k": k, "scale": sc}) for k in (3, 5, 8) for sc in (2, 4)
    },
    **{
        f"x-mem-dp{k}-x{sc}": exp(memory=True, extra={"k": k, "scale": sc, "dp": True})
        for k in (1, 2, 3, 5, 8, 12, 20)
        for sc in (1, 2, 4)
    },
    **{
        f"x-mem-dp{k}-s{q}": exp(memory=True, score=str(q), extra={"k": k, "dp": True})
        for k in (5, 8, 12)
        for q in (2, 4, 6, 8, 10, 12)
    },
    **{
        f"c-dp{k}-s{q}": exp(memory=True, score=str(q), extra={"k": k, "dp": True, "center": True})
        for k in (5, 8, 12)
        for q in (2, 4, 6, 8, 10, 12, 16)
    },
    **{f"c-dp{k}-fgd": exp(memory=True, extra={"k": k, "dp": True, "center": True}) for k in (5, 8, 12)},
    **{
        f"b{k}-x{sc}": exp(memory=True, extra={"k": k, "scale": sc, "best": True})
        for k in (1, 2, 3, 4, 6, 8, 12, 16, 20, 24, 28, 32, 48, 64, 100, 200)
        for sc in (0.5, 0.8, 0.9, 1, 1.1, 1.25, 1.5, 2, 4)
    },
    **{
        f"p{k}-x{sc}": exp(memory=True, extra={"k": k, "scale": sc, "best": True, "pair": True})
        for k in (4, 8, 12, 16, 20, 24, 28, 32, 48, 64)
        for sc in (0.5, 1, 2)
    },
    **{f"pf-pk{k}": exp(memory=True, extra={"pk": k, "pair": True}) for k in (4, 8, 16, 24, 32, 64)},
    **{
        f"pp{k}-x{sc}": exp(
            memory=True, extra={"k": k, "scale": sc, "best": True, "pair": True, "pairfirst": True}
        )
        for k in (4, 8, 12, 16, 20, 24, 28, 32, 48, 64)
        for sc in (0.5, 1, 2)
    },
    **{
        f"ppf-pk{k}": exp(memory=True, extra={"pk": k, "pair": True, "pairfirst": True})
        for k in (4, 8, 16, 24, 32, 64)
    },
    **{
        f"sp{k}-{q}": exp(memory=True, score=q, extra={"k": k, "best": True, "split": True})
        for k in (8, 16, 24, 32, 48, 64)
        for q in ("fgd", "2", "5", "10", "20", "40")
    },
    **{
        f"osp{k}-{q}-w{w}": exp(
            mix="online", window=w, memory=True, score=q, extra={"k": k, "best": True, "split": True}
        )
        for k in (16, 24, 32)
        for q in ("5", "10")
        for w in (500, 1000, 2000, 4000)
    },
    **{
        f"rsp24-5-r{r}": exp(
            memory=True, score="5", extra={"k": 24, "best": True, "split": True, "reserve": r}
        )
        for r in (0.5, 1, 2, 4)
    },
    **{
        f"orsp24-5-r{r}": exp(
            mix="online", memory=True, score="5", extra={"k": 24, "best": True, "split": True, "reserve": r}
        )
        for r in (0.5, 1, 2, 4)
    },
    **{
        f"orsp24-5-r1-w{w}": exp(
            mix="online",
            window=w,
            memory=True,
            score="5",
            extra={"k": 24, "best": True, "split": True, "reserve": 1},
        )
        for w in (2000, 4000, 8000)
    },
    **{
        f"orsp-freeze{f}": exp(
            mix="online",
            window=20000,
            memory=True,
            score="5",
            extra={"k": 24, "best": True, "split": True, "reserve": 1, "freeze": f},
        )
        for f in (500, 2000, 8000)
    },
    **{
        f"lt{k}-{t}-r{r}": exp(
            memory=True, extra={"k": k, "best": True, "split": True, "reserve": r, "ltol": t}
        )
        for k in (16, 24, 32)
        for t in (1, 2, 3, 5, 8)
        for r in (0, 1)
    },
    **{
        f"olt{k}-{t}-r{r}": exp(
            mix="online", memory=True, extra={"k": k, "best": True, "split": True, "reserve": r, "ltol": t}
        )
        for k in (16, 24, 32)
        for t in (1, 2, 3, 5, 8)
        for r in (0, 1)
    },
    **{
        f"plt{k}-{t}-p{pr}": exp(
            memory=True, extra={"k": k, "best": True, "split": True, "pressure": pr, "ltol": t}
        )
        for k in (16, 24, 32)
        for t in (2, 3, 5, 8)
        for pr in (0.5, 1, 2)
    },
    **{
        f"oplt{k}-{t}-p{pr}": exp(
            mix="online", memory=True, extra={"k": k, "best": True, "split": True, "pressure": pr, "ltol": t}
        )
        for k in (16, 24, 32)
        for t in (2, 3, 5, 8)
        for pr in (0.5, 1, 2)
    },
    **{
        f"g{k}-{pk}-{t}": exp(
            memory=True, extra={"k": k, "pk": pk, "best": True, "split": True, "pressure": 1, "ltol": t}
        )
        for k in (8, 12, 16, 24, 32, 48)
        for pk in (16, 20, 24, 28, 32)
        for t in (2, 3, 4, 5)
    },
    **{
        f"g{k}-{pk}-{t}-nomem": exp(
            memory=False, extra={"k": k, "pk": pk, "best": True, "split": True, "pressure": 1, "ltol": t}
        )
        for k in (8, 12, 16, 24, 32, 48)
        for pk in (16, 20, 24, 28, 32)
        for t in (2, 3, 4, 5)
    },
    **{
        f"x-mem-tol{t}": exp(memory=True, score="exact", extra={"tol": float(t)})
        for t in (1, 2, 4, 6, 8, 12, 16)
    },
}


def split_variant(name: str) -> VariantFactory:
    """``S-k24-t3-p1[-on][-nomem][-w2000]``: the split design with hole horizon k, node-key
    tolerance t, model pressure weight p, online mix, memory off, window."""
    parts = name.split("-")[1:]
    kw: dict = {"memory": True}
    extra: dict = {"best": True, "split": True, "k": 24, "ltol": 3.0, "pressure": 1.0}
    for part in parts:
        if "=" in part:
            extra[part.split("=")[0]] = float(part.split("=")[1])
        elif part == "on":
            kw["mix"] = "online"
        elif part == "nomem":
            kw["memory"] = False
        elif part[0] == "k":
            extra["k"] = float(part[1:])
        elif part[0] == "q":  # round key 0 to steps of q instead of a tolerance
            extra["ltol"] = -float(part[1:])
        elif part[0] == "t":
            extra["ltol"] = float(part[1:])
        elif part[0] == "p":
            extra["pressure"] = float(part[1:])
        elif part[0] == "w":
            kw["window"] = int(part[1:])
        else:
            extra[part.split("=")[0]] = float(part.split("=")[1])
    return exp(extra=extra, **kw)


def variant(name: str) -> VariantFactory:
    if name in VARIANTS:
        return VARIANTS[name]
    if name.startswith("S-") or name == "S":
        return split_variant(name)
    raise KeyError(f"unknown variant {name}")


# ---------------------------------------------------------------- runner

_W: dict = {}


def _init(trace: str) -> None:
    pods = load_pods(resolve_trace(trace))
    _W.update(nodes=load_nodes(), pods=pods, mix=target_workload(pods))


def run_one(name: str, seed: int) -> tuple[str, int, float, float]:
    started = time.perf_counter()
    setup = paper_setup(_W["nodes"], _W["pods"], seed)
    requests = to_requests(setup.pods)
    state = ClusterState(_W["nodes"])
    policy = variant(name)(setup, _W["pods"], _W["mix"])
    log, _ = replay(state, requests, policy)
    return name, seed, float(curves(log).unallocated[100]), time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("variants", nargs="?", default="fgd")
    parser.add_argument("--trace", default="default")
    parser.add_argument("--seeds", default="42-46")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args()
    if args.list:
        print("\n".join(VARIANTS))
        return
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        variant(v)  # fail fast on a bad name
    seeds = parse_seeds(args.seeds)
    jobs = [(v, s) for v in variants for s in seeds]
    started = time.perf_counter()
    with ProcessPoolExecutor(args.workers, initializer=_init, initargs=(args.trace,)) as pool:
        results = list(pool.map(run_one, *zip(*jobs, strict=False)))
    print(f"{args.trace}: unallocated GPU % at 100% arrived, seeds {args.seeds}")
    for v in variants:
        vals = [r[2] for r in results if r[0] == v]
        secs = statistics.fmean(r[3] for r in results if r[0] == v)
        sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
        per_seed = " ".join(f"{x:.2f}" for x in vals)
        print(f"{v:<28} {statistics.fmean(vals):6.3f} ± {sd:4.2f}  [{per_seed}]  {secs:5.1f} s/run")
    print(f"wall {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
