"""The workload mix a fragmentation-aware scorer plans for: which task shapes arrive, how often.

FGD (USENIX ATC '23) measures a node's fragmentation against a *target workload*: the task shapes
that make up most of the trace, with their frequencies. A production allocator has no oracle for
the future, so it keeps a configured prior mix and blends in a sliding window of the shapes it has
actually seen (:class:`OnlineMix`). Everything here is pure: plain data in, plain data out.

Units follow the per-node summaries the scorer reads: GPU shares in percent of one GPU (0..100,
Koordinator's ``gpu-core``), CPU in milli-cores, memory in MiB.
"""

from __future__ import annotations

import bisect
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property

#: FGD keeps the most popular shapes until they cover this share of the tasks (podPopularityThreshold).
DEFAULT_COVERAGE = 0.95


@dataclass(frozen=True, slots=True, order=True)
class TaskShape:
    """One kind of task as the fragmentation measure sees it.

    ``gpu_pct`` is the share of *each* requested GPU in percent: 100 for whole GPUs, 1..99 for a
    GPU-sharing task, 0 for a CPU-only task (then ``gpu_count`` is 0 too). ``gpu_models`` lists the
    GPU models the task accepts; empty means any model. ``memory_mib`` is optional: FGD's measure
    ignores memory (0 here), topoalloc's checks it when the caller passes the node's free memory.
    Shapes that differ only in memory form one shape for FGD's popularity cut (see
    :meth:`WorkloadMix.from_counts`).
    """

    cpu_milli: int
    gpu_pct: int = 0
    gpu_count: int = 0
    gpu_models: tuple[str, ...] = ()
    memory_mib: int = 0

    def __post_init__(self) -> None:
        if self.cpu_milli < 0 or self.memory_mib < 0 or not 0 <= self.gpu_pct <= 100 or self.gpu_count < 0:
            raise ValueError(f"invalid task shape {self!r}")
        if (self.gpu_pct == 0) != (self.gpu_count == 0):
            raise ValueError(f"gpu_pct and gpu_count must both be zero or both positive: {self!r}")
        if self.gpu_count > 1 and self.gpu_pct != 100:
            raise ValueError(f"a multi-GPU task takes whole GPUs: {self!r}")

    @property
    def cpu_only(self) -> bool:
        return self.gpu_count == 0

    @property
    def gpu_demand_pct(self) -> int:
        """Total GPU demand of one task, in percent of a GPU."""
        return self.gpu_pct * self.gpu_count

    def accepts(self, model: str) -> bool:
        return not self.gpu_models or model in self.gpu_models

    def without_memory(self) -> TaskShape:
        return replace(self, memory_mib=0) if self.memory_mib else self


@dataclass(frozen=True, slots=True)
class ShapeGroup:
    """Shapes of a mix that share (per-GPU share, GPU count), for one GPU model.

    ``cpus`` is ascending (``memories`` and ``weights`` in the same order); ``cum_weight[i]`` is
    the total weight of the first ``i`` shapes, so the weight of the shapes whose CPU request fits
    in ``c`` free milli-cores is ``cum_weight[bisect_right(cpus, c)]``.
    """

    gpu_pct: int
    gpu_count: int
    cpus: tuple[int, ...]
    cum_weight: tuple[float, ...]
    memories: tuple[int, ...] = ()
    weights: tuple[float, ...] = ()

    @property
    def total_weight(self) -> float:
        return self.cum_weight[-1]

    def weight_fitting_cpu(self, cpu_free_milli: int) -> float:
        return self.cum_weight[bisect.bisect_right(self.cpus, cpu_free_milli)]

    def weight_fitting(self, cpu_free_milli: int, memory_free_mib: int | None) -> float:
        """Weight of the shapes whose CPU and (when given) memory requests fit."""
        end = bisect.bisect_right(self.cpus, cpu_free_milli)
        if (
            memory_free_mib is None
            or not self.memories
            or max(self.memories[:end], default=0) <= memory_free_mib
        ):
            return self.cum_weight[end]
        return sum(
            w for m, w in zip(self.memories[:end], self.weights[:end], strict=True) if m <= memory_free_mib
        )


@dataclass(frozen=True)
class CompiledMix:
    """A mix reduced to what the fragmentation measure needs on nodes of one GPU model.

    CPU-only shapes and shapes that reject the model contribute nothing here: for them all idle GPU
    on the node is fragment, whatever the node's state.
    """

    model: str
    groups: tuple[ShapeGroup, ...]

    @cached_property
    def cpu_per_gpu_pct(self) -> float:
        """CPU (milli-cores) the mix's GPU tasks on this model request per GPU percent they take,
        over all of them (ratio of the weighted sums); 0 without GPU tasks."""
        cpu = gpu = 0.0
        for g in self.groups:
            for c, w in zip(g.cpus, g.weights, strict=True):
                cpu += w * c
                gpu += w * g.gpu_pct * g.gpu_count
        return cpu / gpu if gpu else 0.0

    @cached_property
    def sharing_weights(self) -> tuple[tuple[int, float], ...]:
        """(per-GPU share, total weight) of the GPU-sharing groups, ascending by share."""
        return tuple((g.gpu_pct, g.total_weight) for g in self.groups if g.gpu_pct < 100)


@dataclass(frozen=True)
class WorkloadMix:
    """Task shapes with their probabilities (summing to 1)."""

    shapes: tuple[TaskShape, ...]
    weights: tuple[float, ...]
    _compiled: dict[str, CompiledMix] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.shapes) != len(self.weights):
            raise ValueError("shapes and weights differ in length")
        if any(w < 0 for w in self.weights):
            raise ValueError("negative weight in a workload mix")
        if self.shapes and abs(sum(self.weights) - 1.0) > 1e-9:
            raise ValueError(f"weights sum to {sum(self.weights)}, not 1")

    @classmethod
    def from_counts(
        cls, counts: Mapping[TaskShape, float], coverage: float = DEFAULT_COVERAGE
    ) -> WorkloadMix:
        """FGD's target workload: the most frequent shapes until they cover ``coverage`` of all
        tasks, renormalised. Equal counts are ordered by shape so the result is deterministic.

        Popularity is counted over shapes without memory (FGD's grouping); a kept shape keeps
        its memory variants, each with its own count."""
        if not 0 < coverage <= 1:
            raise ValueError("coverage must be in (0, 1]")
        total = float(sum(counts.values()))
        if total <= 0:
            return cls((), ())
        variants: dict[TaskShape, list[tuple[TaskShape, float]]] = {}
        for shape, count in counts.items():
            if count > 0:
                variants.setdefault(shape.without_memory(), []).append((shape, count))
        ranked = sorted(variants.items(), key=lambda kv: (-sum(c for _, c in kv[1]), kv[0]))
        kept: list[tuple[TaskShape, float]] = []
        covered = 0.0
        for _, members in ranked:
            kept.extend(sorted(members))
            covered += sum(c for _, c in members)
            if covered >= coverage * total - 1e-9:
                break
        return cls(tuple(s for s, _ in kept), tuple(c / covered for _, c in kept))

    def distance(self, other: WorkloadMix) -> float:
        """Total variation distance: the probability mass that would have to move to turn one
        mix into the other (0 for equal mixes, 1 for mixes with no shape in common)."""
        mine = dict(zip(self.shapes, self.weights, strict=True))
        theirs = dict(zip(other.shapes, other.weights, strict=True))
        return 0.5 * sum(abs(mine.get(s, 0.0) - theirs.get(s, 0.0)) for s in mine.keys() | theirs.keys())

    @classmethod
    def from_tasks(cls, tasks: Iterable[TaskShape], coverage: float = DEFAULT_COVERAGE) -> WorkloadMix:
        return cls.from_counts(Counter(tasks), coverage)

    @cached_property
    def cpu_per_gpu_milli(self) -> float:
        """CPU the mix's GPU tasks request per whole GPU of demand (milli-cores); 0 without GPU tasks."""
        cpu = gpus = 0.0
        for shape, weight in zip(self.shapes, self.weights, strict=True):
            if not shape.cpu_only:
                cpu += weight * shape.cpu_milli
                gpus += weight * shape.gpu_demand_pct / 100.0
        return cpu / gpus if gpus else 0.0

    def model_pressure(self, idle_by_model: Mapping[str, float]) -> dict[str, float]:
        """How much of each model's idle GPU the mix's model-constrained tasks are expected to
        claim, 0..1 (1: every idle GPU of that model will be wanted by tasks that cannot run
        elsewhere).

        Expected future demand is the cluster's idle GPU split by the mix's GPU demand; a
        constrained shape's share is spread over the models it accepts in proportion to their
        idle GPU. ``idle_by_model`` is idle GPU (any unit) per model in the cluster; models
        without idle GPU get 1. Unconstrained shapes put no pressure on any model.
        """
        demand = sum(w * s.gpu_demand_pct for s, w in zip(self.shapes, self.weights, strict=True))
        total_idle = float(sum(idle_by_model.values()))
        need = dict.fromkeys(idle_by_model, 0.0)
        if demand > 0 and total_idle > 0:
            for shape, weight in zip(self.shapes, self.weights, strict=True):
                if not shape.gpu_models or not shape.gpu_count:
                    continue
                accepted = [m for m in shape.gpu_models if idle_by_model.get(m, 0) > 0]
                pool = sum(idle_by_model[m] for m in accepted)
                if pool <= 0:
                    continue
                expected = weight * shape.gpu_demand_pct / demand * total_idle
                for m in accepted:
                    need[m] += expected * idle_by_model[m] / pool
        return {m: min(1.0, need[m] / idle) if idle > 0 else 1.0 for m, idle in idle_by_model.items()}

    def compiled_for(self, model: str) -> CompiledMix:
        """The mix as the fragmentation measure evaluates it on a node with GPUs of ``model``."""
        hit = self._compiled.get(model)
        if hit is not None:
            return hit
        by_group: dict[tuple[int, int], list[tuple[int, int, float]]] = {}
        for shape, weight in zip(self.shapes, self.weights, strict=True):
            if shape.cpu_only or not shape.accepts(model) or weight == 0:
                continue
            member = (shape.cpu_milli, shape.memory_mib, weight)
            by_group.setdefault((shape.gpu_pct, shape.gpu_count), []).append(member)
        groups = []
        for (pct, count), members in sorted(by_group.items()):
            members.sort()
            cum = [0.0]
            for _, _, w in members:
                cum.append(cum[-1] + w)
            groups.append(
                ShapeGroup(
                    pct,
                    count,
                    tuple(c for c, _, _ in members),
                    tuple(cum),
                    tuple(m for _, m, _ in members),
                    tuple(w for _, _, w in members),
                )
            )
        compiled = CompiledMix(model, tuple(groups))
        self._compiled[model] = compiled
        return compiled


class OnlineMix:
    """A workload mix learned while scheduling: a configured prior blended with a sliding window
    of the task shapes seen most recently.

    The prior counts as ``prior_weight`` tasks spread by its probabilities, so with a full window
    of ``window`` tasks the prior keeps ``prior_weight / (prior_weight + window)`` of the say. With
    no prior the mix is the window alone. :meth:`mix` is recomputed at most every
    ``refresh_every`` observations, so a scorer can call it per pod, and a recomputed mix replaces
    the current one only when it moved more than ``tolerance`` (total variation distance): each
    replacement makes a scorer rescore every node, and a steady workload's window only wobbles.
    """

    def __init__(
        self,
        prior: WorkloadMix | None = None,
        *,
        window: int = 2000,
        prior_weight: float = 500.0,
        coverage: float = DEFAULT_COVERAGE,
        refresh_every: int = 50,
        tolerance: float = 0.0,
    ) -> None:
        if window <= 0 or refresh_every <= 0 or prior_weight < 0:
            raise ValueError("window and refresh_every must be positive, prior_weight non-negative")
        if not 0 <= tolerance < 1:
            raise ValueError("tolerance must be in [0, 1)")
        self._tolerance = tolerance
        self._prior = prior
        self._prior_weight = prior_weight if prior is not None else 0.0
        self._recent: deque[TaskShape] = deque(maxlen=window)
        self._counts: Counter[TaskShape] = Counter()
        self._coverage = coverage
        self._refresh_every = refresh_every
        self._since_refresh = refresh_every  # forces a build on first use
        self._mix: WorkloadMix | None = None

    def observe(self, shape: TaskShape) -> None:
        if len(self._recent) == self._recent.maxlen:
            old = self._recent[0]
            self._counts[old] -= 1
            if self._counts[old] == 0:
                del self._counts[old]
        self._recent.append(shape)
        self._counts[shape] += 1
        self._since_refresh += 1

    def mix(self) -> WorkloadMix:
        due = min(self._refresh_every, max(1, len(self._recent) // 2))
        if self._mix is None or self._since_refresh >= due:
            counts: Counter[TaskShape] = Counter()
            if self._prior is not None:
                for s, w in zip(self._prior.shapes, self._prior.weights, strict=True):
                    counts[s] += w * self._prior_weight
            for s, c in self._counts.items():
                counts[s] += c
            fresh = WorkloadMix.from_counts(counts, self._coverage)
            if self._mix is None or fresh.distance(self._mix) > self._tolerance:
                self._mix = fresh
            self._since_refresh = 0
        return self._mix
