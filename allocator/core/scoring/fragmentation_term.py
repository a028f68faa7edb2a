"""The fragmentation component of the production node scorer: FGD's score on live node state.

Adapts `NodeState` + `PodRequest` to the pure measure in `fragmentation.py`: the pod becomes a
`TaskShape` (CPU, per-GPU share, GPU count, accepted GPU models), the node gives its per-GPU free
share, free CPU and GPU model (the `FragmentationView` summaries). The workload mix the measure
plans for is an `OnlineMix`: an optional prior from the scoring config, blended with the shapes
of the pods the cluster placed most recently (`observe`, fed by `ClusterState.assign(request=)`).

The term abstains (None) for pods it cannot express as one task shape (GPU memory asked in bytes,
a share spread over several GPUs, invalid requests) and while the mix is still empty.
`preferred_gpus` tells the bind path which GPU the score assumed for a shared pod, so that the
device chosen at bind is the one that was ranked (see docs/compatibility.md).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from allocator.core.request import PodRequest
from allocator.core.scoring.fragmentation import NodeScore, score_node
from allocator.core.scoring.workload_mix import DEFAULT_COVERAGE, OnlineMix, TaskShape, WorkloadMix
from allocator.core.state import NodeState
from apis import keys
from apis import resources as rn
from apis.quantity import Quantity

_MEMO_LIMIT = 200_000
_MISSING = object()


@dataclass(frozen=True)
class FragmentationSettings:
    """How the term learns its workload mix (`fragmentation:` in the scoring config).

    ```yaml
    fragmentation:
      window: 1000        # recent placed pods the mix is learned from
      refreshEvery: 200   # rebuild the mix after this many placements
      priorWeight: 500    # the prior counts as this many pods
      coverage: 0.95      # keep the most frequent shapes until they cover this share
      prior:              # optional seed mix; gpuShare is percent of one GPU per GPU
        - {cpu: "4", gpuShare: 50, gpus: 1, weight: 3}
        - {cpu: "16", gpuShare: 100, gpus: 8, models: [H100-80GB-HBM3], weight: 1}
    ```
    """

    window: int = 1000
    refresh_every: int = 200
    prior_weight: float = 500.0
    coverage: float = DEFAULT_COVERAGE
    prior: tuple[tuple[TaskShape, float], ...] = ()

    def __post_init__(self) -> None:
        if self.window <= 0 or self.refresh_every <= 0:
            raise ValueError("fragmentation.window and fragmentation.refreshEvery must be positive")
        if self.prior_weight < 0 or not 0 < self.coverage <= 1:
            raise ValueError("fragmentation.priorWeight must be >= 0 and coverage in (0, 1]")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> FragmentationSettings:
        """Raises ValueError naming the bad field."""
        data = dict(data or {})
        unknown = set(data) - {"window", "refreshEvery", "priorWeight", "coverage", "prior"}
        if unknown:
            raise ValueError(f"unknown fragmentation settings: {', '.join(sorted(unknown))}")
        prior = []
        for i, item in enumerate(data.get("prior") or ()):
            where = f"fragmentation.prior[{i}]"
            if not isinstance(item, Mapping):
                raise ValueError(f"{where}: expected {{cpu, gpuShare, gpus, models, weight}}")
            try:
                cpu = Quantity.parse(str(item.get("cpu", "0")), f"{where}.cpu").milli_value()
                gpus = int(item.get("gpus", 0))
                share = int(item.get("gpuShare", 100 if gpus else 0))
                models = tuple(sorted(str(m) for m in item.get("models") or ()))
                weight = float(item.get("weight", 1))
                shape = TaskShape(cpu, share if gpus else 0, gpus, models)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{where}: {exc}") from None
            if weight <= 0:
                raise ValueError(f"{where}.weight: expected a number > 0")
            prior.append((shape, weight))
        try:
            return cls(
                window=int(data.get("window", cls.window)),
                refresh_every=int(data.get("refreshEvery", cls.refresh_every)),
                prior_weight=float(data.get("priorWeight", cls.prior_weight)),
                coverage=float(data.get("coverage", cls.coverage)),
                prior=tuple(prior),
            )
        except TypeError as exc:
            raise ValueError(f"fragmentation: {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "window": self.window,
            "refreshEvery": self.refresh_every,
            "priorWeight": self.prior_weight,
            "coverage": self.coverage,
        }
        if self.prior:
            out["prior"] = [
                {
                    "cpu": f"{s.cpu_milli}m",
                    "gpuShare": s.gpu_pct,
                    "gpus": s.gpu_count,
                    "models": list(s.gpu_models),
                    "weight": w,
                }
                for s, w in self.prior
            ]
        return out

    def prior_mix(self) -> WorkloadMix | None:
        if not self.prior:
            return None
        total = sum(w for _, w in self.prior)
        counts: dict[TaskShape, float] = {}
        for shape, weight in self.prior:
            counts[shape] = counts.get(shape, 0.0) + weight / total
        return WorkloadMix.from_counts(counts, coverage=1.0)


def required_gpu_models(req: PodRequest) -> tuple[str, ...]:
    """GPU models the pod accepts through nodeSelector or required node affinity on the
    `node.koordinator.sh/gpu-model` label (empty: any). Affinity terms are ORed, so a model
    restriction holds only when every term carries one."""
    allowed: set[str] | None = None
    chosen = req.node_selector.get(keys.GPU_MODEL)
    if chosen is not None:
        allowed = {chosen}
    terms = req.affinity_terms
    if terms:
        union: set[str] = set()
        for term in terms:
            values = [set(v) for k, op, v in term.expressions if k == keys.GPU_MODEL and op == "In"]
            if not values:
                union = set()
                break
            union |= set.intersection(*values)
        else:
            allowed = union if allowed is None else allowed & union
    return tuple(sorted(allowed)) if allowed else ()


def task_shape(req: PodRequest) -> TaskShape | None:
    """The pod as the fragmentation measure sees it; None when it cannot be one task shape."""
    if req.invalid is not None:
        return None
    g = req.gpu
    if g is None:
        return TaskShape(req.cpu_milli)
    per = g.per_gpu_map
    if g.whole:
        pct = 100
    elif g.count == 1:
        pct = max(per.get(rn.GPU_CORE, 0), per.get(rn.GPU_MEMORY_RATIO, 0))
        if pct <= 0 or (rn.GPU_MEMORY in per and rn.GPU_MEMORY_RATIO not in per):
            return None  # memory in bytes: the share depends on the node's GPU size
        pct = min(pct, 100)
    else:
        return None
    return TaskShape(req.cpu_milli, pct, g.count, required_gpu_models(req))


class FragmentationTerm:
    """A NodeScorer component (`prepare(req) -> fn(state)`), 0..99 where higher means the node's
    fragmentation grows least. `version()` changes whenever the learned mix does; the scorer then
    forgets its cached scores."""

    def __init__(self, settings: FragmentationSettings | None = None) -> None:
        self.settings = settings or FragmentationSettings()
        s = self.settings
        self.online = OnlineMix(
            s.prior_mix(),
            window=s.window,
            prior_weight=s.prior_weight,
            coverage=s.coverage,
            refresh_every=s.refresh_every,
        )
        self._mix: WorkloadMix | None = None
        self._version = 0
        # Until the online mix first has shapes (it rebuilds every `refresh_every` placements), the
        # term plans for the shapes seen so far, rebuilt whenever their number has doubled: a fresh
        # allocator needs no prior to start packing by fragmentation.
        self._early: list[TaskShape] | None = []
        self._early_mix: WorkloadMix | None = None
        self._early_size = 0
        self._memo: dict[tuple[Any, ...], NodeScore | None] = {}
        self._cuts: dict[str, tuple[int, ...]] = {}  # per GPU model: the mix's CPU requests, sorted
        self._shape_ids: dict[TaskShape, int] = {}

    # -- learning ----------------------------------------------------------------------------
    def observe(self, req: PodRequest) -> None:
        shape = task_shape(req)
        if shape is not None:
            self.online.observe(shape)
            if self._early is not None:
                self._early.append(shape)

    def mix(self) -> WorkloadMix:
        mix = self.online.mix()
        if self._early is not None:
            if mix.shapes:
                self._early = None  # the online mix has taken over for good
            else:
                n = len(self._early)
                if n and n >= 2 * self._early_size:
                    self._early_mix = WorkloadMix.from_tasks(self._early, self.settings.coverage)
                    self._early_size = n
                if self._early_mix is not None:
                    mix = self._early_mix
        if mix is not self._mix:
            self._mix = mix
            self._version += 1
            self._memo = {}
            self._cuts = {}
        return mix

    def version(self) -> int:
        self.mix()
        return self._version

    # -- scoring -----------------------------------------------------------------------------
    def placement(self, state: NodeState, req: PodRequest) -> NodeScore | None:
        """The score and the GPUs it assumes, or None when the term abstains or the GPU part
        does not fit."""
        fn = self._memoised(req)
        return None if fn is None else fn(state)

    def prepare(self, req: PodRequest) -> Callable[[NodeState], float | None] | None:
        placement = self._memoised(req)
        if placement is None:
            return None

        def score(state: NodeState) -> float | None:
            result = placement(state)
            return None if result is None else result.score

        return score

    def preferred_gpus(self, state: NodeState, req: PodRequest) -> tuple[int, ...] | None:
        """The GPU a shared pod was scored on; None for other pods (for whole GPUs any fully free
        GPU leaves the same fragmentation, so the allocator's topology choice stands)."""
        shape = task_shape(req)
        if shape is None or shape.gpu_count != 1 or shape.gpu_pct >= 100:
            return None
        result = self.placement(state, req)
        return None if result is None else result.gpus

    def _memoised(self, req: PodRequest) -> Callable[[NodeState], NodeScore | None] | None:
        """`score_node` for this pod on a node, remembered per node state until the mix changes.

        The measure reads free CPU only through which of the mix's CPU requests fit in it, before
        and after the pod's own CPU is taken, so the memo keys CPU by its position among those
        requests: nodes of one type whose GPUs are in the same state share the result."""
        shape = task_shape(req)
        if shape is None:
            return None
        mix = self.mix()
        if not mix.shapes:
            return None  # nothing learned yet: no opinion
        sid = self._shape_ids.setdefault(shape, len(self._shape_ids))
        memo = self._memo
        cuts_by_model = self._cuts
        need = shape.cpu_milli

        def placement(state: NodeState) -> NodeScore | None:
            free: Sequence[int] = state.gpu_free_core_pct
            cpu = state.cpu_free_milli
            model = state.gpu_model
            cuts = cuts_by_model.get(model)
            if cuts is None:
                compiled = mix.compiled_for(model)
                cuts = cuts_by_model[model] = tuple(sorted({c for g in compiled.groups for c in g.cpus}))
            key = (sid, model, free, bisect_right(cuts, cpu), bisect_right(cuts, cpu - need))
            result = memo.get(key, _MISSING)
            if result is _MISSING:
                if len(memo) >= _MEMO_LIMIT:
                    memo.clear()
                result = memo[key] = score_node(free, cpu, model, shape, mix)
            return result  # type: ignore[return-value]

        return placement
