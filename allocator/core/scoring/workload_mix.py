"""The workload mix a fragmentation-aware scorer plans for: which task shapes arrive, how often.

FGD (USENIX ATC '23) measures a node's fragmentation against a *target workload*: the task shapes
that make up most of the trace, with their frequencies. A production allocator has no oracle for
the future, so it keeps a configured prior mix and blends in a sliding window of the shapes it has
actually seen (:class:`OnlineMix`). Everything here is pure: plain data in, plain data out.

Units follow the per-node summaries the scorer reads: GPU shares in percent of one GPU (0..100,
Koordinator's ``gpu-core``), CPU in milli-cores.
"""

from __future__ import annotations

import bisect
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

#: FGD keeps the most popular shapes until they cover this share of the tasks (podPopularityThreshold).
DEFAULT_COVERAGE = 0.95


@dataclass(frozen=True, slots=True, order=True)
class TaskShape:
    """One kind of task as the fragmentation measure sees it (memory is deliberately not part of it).

    ``gpu_pct`` is the share of *each* requested GPU in percent: 100 for whole GPUs, 1..99 for a
    GPU-sharing task, 0 for a CPU-only task (then ``gpu_count`` is 0 too). ``gpu_models`` lists the
    GPU models the task accepts; empty means any model.
    """

    cpu_milli: int
    gpu_pct: int = 0
    gpu_count: int = 0
    gpu_models: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.cpu_milli < 0 or not 0 <= self.gpu_pct <= 100 or self.gpu_count < 0:
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


@dataclass(frozen=True, slots=True)
class ShapeGroup:
    """Shapes of a mix that share (per-GPU share, GPU count), for one GPU model.

    ``cpus`` is ascending; ``cum_weight[i]`` is the total weight of the first ``i`` shapes, so the
    weight of the shapes whose CPU request fits in ``c`` free milli-cores is
    ``cum_weight[bisect_right(cpus, c)]``.
    """

    gpu_pct: int
    gpu_count: int
    cpus: tuple[int, ...]
    cum_weight: tuple[float, ...]

    def weight_fitting_cpu(self, cpu_free_milli: int) -> float:
        return self.cum_weight[bisect.bisect_right(self.cpus, cpu_free_milli)]


@dataclass(frozen=True, slots=True)
class CompiledMix:
    """A mix reduced to what the fragmentation measure needs on nodes of one GPU model.

    CPU-only shapes and shapes that reject the model contribute nothing here: for them all idle GPU
    on the node is fragment, whatever the node's state.
    """

    model: str
    groups: tuple[ShapeGroup, ...]


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
        tasks, renormalised. Equal counts are ordered by shape so the result is deterministic."""
        if not 0 < coverage <= 1:
            raise ValueError("coverage must be in (0, 1]")
        total = float(sum(counts.values()))
        if total <= 0:
            return cls((), ())
        ranked = sorted(((c, s) for s, c in counts.items() if c > 0), key=lambda cs: (-cs[0], cs[1]))
        kept: list[tuple[float, TaskShape]] = []
        covered = 0.0
        for count, shape in ranked:
            kept.append((count, shape))
            covered += count
            if covered >= coverage * total - 1e-9:
                break
        return cls(tuple(s for _, s in kept), tuple(c / covered for c, _ in kept))

    @classmethod
    def from_tasks(cls, tasks: Iterable[TaskShape], coverage: float = DEFAULT_COVERAGE) -> WorkloadMix:
        return cls.from_counts(Counter(tasks), coverage)

    @cached_property
    def cpu_only_weight(self) -> float:
        return sum(w for s, w in zip(self.shapes, self.weights, strict=True) if s.cpu_only)

    @cached_property
    def cpu_per_gpu_milli(self) -> float:
        """CPU the mix's GPU tasks request per whole GPU of demand (milli-cores); 0 without GPU tasks."""
        cpu = gpus = 0.0
        for shape, weight in zip(self.shapes, self.weights, strict=True):
            if not shape.cpu_only:
                cpu += weight * shape.cpu_milli
                gpus += weight * shape.gpu_demand_pct / 100.0
        return cpu / gpus if gpus else 0.0

    def compiled_for(self, model: str) -> CompiledMix:
        """The mix as the fragmentation measure evaluates it on a node with GPUs of ``model``."""
        hit = self._compiled.get(model)
        if hit is not None:
            return hit
        by_group: dict[tuple[int, int], list[tuple[int, float]]] = {}
        for shape, weight in zip(self.shapes, self.weights, strict=True):
            if shape.cpu_only or not shape.accepts(model) or weight == 0:
                continue
            by_group.setdefault((shape.gpu_pct, shape.gpu_count), []).append((shape.cpu_milli, weight))
        groups = []
        for (pct, count), members in sorted(by_group.items()):
            members.sort()
            cum = [0.0]
            for _, w in members:
                cum.append(cum[-1] + w)
            groups.append(ShapeGroup(pct, count, tuple(c for c, _ in members), tuple(cum)))
        compiled = CompiledMix(model, tuple(groups))
        self._compiled[model] = compiled
        return compiled


class OnlineMix:
    """A workload mix learned while scheduling: a configured prior blended with a sliding window
    of the task shapes seen most recently.

    The prior counts as ``prior_weight`` tasks spread by its probabilities, so with a full window
    of ``window`` tasks the prior keeps ``prior_weight / (prior_weight + window)`` of the say. With
    no prior the mix is the window alone. :meth:`mix` is recomputed at most every
    ``refresh_every`` observations, so a scorer can call it per pod.
    """

    def __init__(
        self,
        prior: WorkloadMix | None = None,
        *,
        window: int = 2000,
        prior_weight: float = 500.0,
        coverage: float = DEFAULT_COVERAGE,
        refresh_every: int = 50,
    ) -> None:
        if window <= 0 or refresh_every <= 0 or prior_weight < 0:
            raise ValueError("window and refresh_every must be positive, prior_weight non-negative")
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
        if self._mix is None or self._since_refresh >= self._refresh_every:
            counts: Counter[TaskShape] = Counter()
            if self._prior is not None:
                for s, w in zip(self._prior.shapes, self._prior.weights, strict=True):
                    counts[s] += w * self._prior_weight
            for s, c in self._counts.items():
                counts[s] += c
            self._mix = WorkloadMix.from_counts(counts, self._coverage)
            self._since_refresh = 0
        return self._mix
