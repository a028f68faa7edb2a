"""The fragmentation component of the production node scorer: expected GPU waste on live node state.

Adapts `NodeState` + `PodRequest` to the pure measure in `fragmentation.py` (`score_node`): the
pod becomes a `TaskShape` (CPU, memory in MiB, per-GPU share, GPU count, accepted GPU models),
the node gives its per-GPU free share, free CPU, free memory and GPU model (`NodeState`
summaries). The workload mix the measure plans for is an `OnlineMix`: an
optional prior from the scoring config, blended with the shapes of the pods the cluster placed
most recently (`observe`, fed by `ClusterState.assign(request=)`).

Model pressure (how much of a GPU model's idle capacity model-constrained pods are expected to
claim, `WorkloadMix.model_pressure`) is read from the node's `NodeTable`: idle GPU per model is a
table total kept incrementally (`NodeTable.totals`), and the pressure is rounded to
1/`PRESSURE_LEVELS` so that it changes, and invalidates cached scores, only now and then.
`version(table)` changes when the mix or the rounded pressure does, or when the room kept for
pods held to a model (`gang_room.GangRoom`) may answer differently; `spoken_for` tells the
topology score where an unconstrained pod should get no credit.

The component's value is `NodeScore.score`: the lexicographic key (rounded node cost, hole cost)
encoded monotonically into 0..100 (`fragmentation.key_value`).

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
from weakref import WeakKeyDictionary

import numpy as np

from allocator.core.node.features import CPU_FREE, MEMORY_FREE
from allocator.core.node.gpu_features import FREE_PCT, GPU_IDLE_PCT, GPU_MODEL, gpu_model
from allocator.core.node.gpu_summary import GPUSummary
from allocator.core.node.state import NodeState
from allocator.core.node.table import NodeTable, combine_keys
from allocator.core.request.pod_request import PodRequest, required_gpu_models
from allocator.core.scoring import fragmentation
from allocator.core.scoring.fragmentation import NodeScore, cpu_budget_step, score_node
from allocator.core.scoring.gang_room import GangRoom, Needs
from allocator.core.scoring.grouped import Group, GroupedScore
from allocator.core.scoring.workload_mix import DEFAULT_COVERAGE, OnlineMix, TaskShape, WorkloadMix
from apis import resources as rn
from apis.quantity import Quantity

_MEMO_LIMIT = 200_000
MIB = 2**20
#: Model pressure is rounded to this many levels (steps of 0.1): each change of the rounded value
#: rescores every node, and on openb gpuspec20 coarser is also better (10 seeds: steps of 0.1
#: 4.42 ± 0.19, 0.02 4.68 ± 0.37, 0.001 4.76 ± 0.31 unallocated; docs/research/fgd-analysis.md).
PRESSURE_LEVELS = 10
_MISSING = object()
# The free-CPU column is clamped to ±2**62; bucketing it is exact while cuts and requests stay
# below 2**61 (real ones are many orders of magnitude smaller).
_EXACT_INT = 2**61


@dataclass(frozen=True)
class FragmentationSettings:
    """How the term learns its workload mix (`fragmentation:` in the scoring config).

    ```yaml
    fragmentation:
      window: 1000        # recent placed pods the mix is learned from
      refreshEvery: 200   # rebuild the mix after this many placements
      priorWeight: 500    # the prior counts as this many pods
      coverage: 0.95      # keep the most frequent shapes until they cover this share
      tolerance: 0.05     # adopt a rebuilt mix only if it moved more than this (total variation)
      prior:              # optional seed mix; gpuShare is percent of one GPU per GPU
        - {cpu: "4", memory: 16Gi, gpuShare: 50, gpus: 1, weight: 3}
        - {cpu: "16", gpuShare: 100, gpus: 8, models: [H100-80GB-HBM3], weight: 1}
    ```
    """

    window: int = 1000
    refresh_every: int = 200
    prior_weight: float = 500.0
    coverage: float = DEFAULT_COVERAGE
    tolerance: float = 0.05
    prior: tuple[tuple[TaskShape, float], ...] = ()

    def __post_init__(self) -> None:
        if self.window <= 0 or self.refresh_every <= 0:
            raise ValueError("fragmentation.window and fragmentation.refreshEvery must be positive")
        if self.prior_weight < 0 or not 0 < self.coverage <= 1:
            raise ValueError("fragmentation.priorWeight must be >= 0 and coverage in (0, 1]")
        if not 0 <= self.tolerance < 1:
            raise ValueError("fragmentation.tolerance must be in [0, 1)")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> FragmentationSettings:
        """Raises ValueError naming the bad field."""
        data = dict(data or {})
        unknown = set(data) - {"window", "refreshEvery", "priorWeight", "coverage", "tolerance", "prior"}
        if unknown:
            raise ValueError(f"unknown fragmentation settings: {', '.join(sorted(unknown))}")
        prior = []
        for i, item in enumerate(data.get("prior") or ()):
            where = f"fragmentation.prior[{i}]"
            if not isinstance(item, Mapping):
                raise ValueError(f"{where}: expected {{cpu, memory, gpuShare, gpus, models, weight}}")
            try:
                cpu = Quantity.parse(str(item.get("cpu", "0")), f"{where}.cpu").milli_value()
                gpus = int(item.get("gpus", 0))
                share = int(item.get("gpuShare", 100 if gpus else 0))
                models = tuple(sorted(str(m) for m in item.get("models") or ()))
                weight = float(item.get("weight", 1))
                memory = Quantity.parse(str(item.get("memory", "0")), f"{where}.memory").value()
                shape = TaskShape(cpu, share if gpus else 0, gpus, models, _mib_up(memory))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{where}: {exc}") from None
            if weight <= 0:
                raise ValueError(f"{where}.weight: expected a number > 0")
            prior.append((shape, weight))
        return cls(
            window=_number(data, "window", cls.window, int),
            refresh_every=_number(data, "refreshEvery", cls.refresh_every, int),
            prior_weight=_number(data, "priorWeight", cls.prior_weight, float),
            coverage=_number(data, "coverage", cls.coverage, float),
            tolerance=_number(data, "tolerance", cls.tolerance, float),
            prior=tuple(prior),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "window": self.window,
            "refreshEvery": self.refresh_every,
            "priorWeight": self.prior_weight,
            "coverage": self.coverage,
            "tolerance": self.tolerance,
        }
        if self.prior:
            out["prior"] = [
                {
                    "cpu": f"{s.cpu_milli}m",
                    "gpuShare": s.gpu_pct,
                    "gpus": s.gpu_count,
                    "models": list(s.gpu_models),
                    **({"memory": f"{s.memory_mib}Mi"} if s.memory_mib else {}),
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


def task_shape(req: PodRequest) -> TaskShape | None:
    """The pod as the fragmentation measure sees it; None when it cannot be one task shape."""
    if req.invalid is not None:
        return None
    g = req.gpu
    mem = _mib_up(req.memory)
    if g is None:
        return TaskShape(req.cpu_milli, memory_mib=mem)
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
    return TaskShape(req.cpu_milli, pct, g.count, required_gpu_models(req), mem)


def _number(data: Mapping[str, Any], key: str, default: Any, kind: Callable[[Any], Any]) -> Any:
    """``kind(data[key])`` (or the default), a ValueError naming the setting when it is not a number."""
    value = data.get(key, default)
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ValueError(f"fragmentation.{key}: expected a number, got {value!r}") from None


def _mib_up(memory_bytes: int) -> int:
    """A memory request in MiB, rounded up (free memory is rounded down: `_mib_down`)."""
    return max(0, -(-memory_bytes // MIB))


def _mib_down(memory_bytes: int) -> int:
    return memory_bytes // MIB


class FragmentationTerm:
    """A NodeScorer component (`prepare(req) -> fn(state)`), 0..100 where higher means the node
    wastes least GPU (`fragmentation.score_node`). `version(table)` changes whenever the learned
    mix or the table's rounded model pressure does; the scorer then forgets its cached scores."""

    reads_table = True  # NodeScorer.sync passes the cluster's NodeTable to `version`

    def __init__(self, settings: FragmentationSettings | None = None) -> None:
        self.settings = settings or FragmentationSettings()
        s = self.settings
        # OnlineMix rebuilds after each doubling of what it has seen until `refresh_every`, so a
        # fresh allocator needs no prior to start planning for its workload.
        self.online = OnlineMix(
            s.prior_mix(),
            window=s.window,
            prior_weight=s.prior_weight,
            coverage=s.coverage,
            refresh_every=s.refresh_every,
            tolerance=s.tolerance,
        )
        self._mix: WorkloadMix | None = None
        self._version = 0
        self._memo: dict[tuple[Any, ...], NodeScore | None] = {}
        self._cuts: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}  # model: CPU, memory cuts
        self._shape_ids: dict[TaskShape, int] = {}
        self._constrained = False  # does the mix hold model-constrained GPU shapes?
        # pressure per table: (table clock, mix version, {model: rounded pressure})
        self._pressure: WeakKeyDictionary[NodeTable, tuple[int, int, dict[str, float]]] = WeakKeyDictionary()
        self._seen: tuple[Any, ...] = ()
        self.room = GangRoom()

    # -- learning ----------------------------------------------------------------------------
    def observe(self, req: PodRequest) -> None:
        shape = task_shape(req)
        if shape is not None:
            self.online.observe(shape)
        self.room.observe(req)

    def mix(self) -> WorkloadMix:
        mix = self.online.mix()
        if mix is not self._mix:
            self._mix = mix
            self._version += 1
            self._memo = {}
            self._cuts = {}
            self._pressure = WeakKeyDictionary()
            self._constrained = any(s.gpu_models and s.gpu_count for s in mix.shapes)
        return mix

    def version(self, table: NodeTable | None = None) -> int:
        """Changes with the mix, and with the rounded model pressure of `table`'s nodes and the
        room they keep for pods held to a model."""
        self.mix()
        if table is not None:
            seen = (tuple(sorted(self.pressure(table).items())), self.room.key(table, self.needs()))
            if seen != self._seen:
                self._seen = seen
                self._version += 1
        return self._version

    def needs(self) -> Needs:
        """The room each GPU model keeps for the pods held to it (`GangRoom.needs`)."""
        return self.room.needs(self.mix().shapes)

    def spoken_for(self, state: NodeState, count: int) -> bool | None:
        """An unconstrained pod taking `count` whole GPUs here would take the room the pods held
        to the node's model need (`GangRoom.keeps_room`); None while no model keeps room. No
        cut-off on the model pressure: one (credit withheld from 0.5) let 4-GPU pods take a gang's
        room while the forecast dipped (bench/quality.py --lifetime 1000, seed 6: the late 4 x
        4-GPU gang never placed)."""
        needs = self.needs()
        if not needs:
            return None
        return not self.room.keeps_room(state, count, needs)

    def pressure(self, table: NodeTable) -> dict[str, float]:
        """Rounded model pressure per GPU model of the table's nodes (empty when the mix has no
        model-constrained GPU shape): O(nodes changed since the last call) plus O(shapes × models)."""
        mix = self.mix()
        if not self._constrained:
            return {}
        hit = self._pressure.get(table)
        if hit is not None and hit[0] == table.clock and hit[1] == self._version:
            return hit[2]
        idle = {m: v for m, v in table.totals(GPU_MODEL, GPU_IDLE_PCT).items() if m}
        rounded = {
            m: round(p * PRESSURE_LEVELS) / PRESSURE_LEVELS for m, p in mix.model_pressure(idle).items()
        }
        self._pressure[table] = (table.clock, self._version, rounded)
        return rounded

    def model_pressure(self, state: NodeState) -> float:
        """The rounded model pressure of the node's GPU model (0 outside a cluster, or while the
        mix has no model-constrained shape)."""
        return self._pressure_of(state)

    def _pressure_of(self, state: NodeState) -> float:
        table = state.table
        if not isinstance(table, NodeTable) or not self._constrained:
            return 0.0
        return self.pressure(table).get(gpu_model(state), 0.0)

    # -- scoring -----------------------------------------------------------------------------
    def placement(self, state: NodeState, req: PodRequest) -> NodeScore | None:
        """The score and the GPUs it assumes, or None when the term abstains or the GPU part
        does not fit."""
        fn = self._memoised(req)
        return None if fn is None else fn(state)

    def prepare(self, req: PodRequest) -> GroupedScore | None:
        placement = self._memoised(req)
        if placement is None:
            return None

        def score(state: NodeState) -> float | None:
            result = placement(state)
            return None if result is None else result.score

        assert self._mix is not None  # set by the mix() that _memoised consulted
        return GroupedScore(score, self._grouping(req, self._mix))

    def preferred_gpus(self, state: NodeState, req: PodRequest) -> tuple[int, ...] | None:
        """The GPU a shared pod was scored on; None for other pods (for whole GPUs any fully free
        GPU leaves the same waste, so the allocator's topology choice stands)."""
        shape = task_shape(req)
        if shape is None or shape.gpu_count != 1 or shape.gpu_pct >= 100:
            return None
        result = self.placement(state, req)
        return None if result is None else result.gpus

    def _memoised(self, req: PodRequest) -> Callable[[NodeState], NodeScore | None] | None:
        """`score_node` for this pod on a node, remembered per node state until the mix changes.

        The measure reads free CPU and free memory only through which of the mix's CPU and
        memory requests fit in them, before and after the pod's own request is taken, free CPU
        also in whole CPU-budget steps (`cpu_budget_step`), and the model pressure of the node's
        GPU model; the memo keys exactly those, so nodes of one type whose GPUs are in the same
        state share the result."""
        shape = task_shape(req)
        if shape is None:
            return None
        mix = self.mix()
        if not mix.shapes:
            return None  # nothing learned yet: no opinion
        sid = self._shape_ids.setdefault(shape, len(self._shape_ids))
        memo = self._memo
        cuts_of = self._cuts_of
        pressure_of = self._pressure_of
        need, need_mem = shape.cpu_milli, shape.memory_mib

        def placement(state: NodeState) -> NodeScore | None:
            free: Sequence[int] = GPUSummary.of(state).free_pct
            cpu = state.cpu_free_milli
            mem = _mib_down(state.memory_free)
            model = gpu_model(state)
            cpu_cuts, mem_cuts = cuts_of(model, mix)
            pressure = pressure_of(state)
            key = (
                sid,
                model,
                free,
                bisect_right(cpu_cuts, cpu),
                bisect_right(cpu_cuts, cpu - need),
                bisect_right(mem_cuts, mem),
                bisect_right(mem_cuts, mem - need_mem),
                cpu_budget_step(cpu),
                cpu_budget_step(cpu - need),
                pressure,
            )
            result = memo.get(key, _MISSING)
            if result is _MISSING:
                if len(memo) >= _MEMO_LIMIT:
                    memo.clear()
                result = memo[key] = score_node(
                    free, cpu, model, shape, mix, memory_free_mib=mem, model_pressure=pressure
                )
            return result  # type: ignore[return-value]

        return placement

    def _cuts_of(self, model: str, mix: WorkloadMix) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The CPU and the memory requests of the mix's shapes that can run on `model`, each
        sorted: the measure reads free CPU and memory only through which of them fit."""
        cuts = self._cuts.get(model)
        if cuts is None:
            compiled = mix.compiled_for(model)
            cpus = tuple(sorted({c for g in compiled.groups for c in g.cpus}))
            mems = tuple(sorted({m for g in compiled.groups for m in g.memories}))
            cuts = self._cuts[model] = (cpus, mems)
        return cuts

    def _grouping(self, req: PodRequest, mix: WorkloadMix) -> Group:
        """Nodes with one memo key (GPU model, per-GPU free share, free CPU's and free memory's
        positions among the mix's requests before and after the pod, free CPU's budget steps
        before and after; the pressure is the model's) get one score: found for many nodes at
        once from the `NodeTable` columns."""
        shape = task_shape(req)
        need = 0 if shape is None else shape.cpu_milli
        need_mem = 0 if shape is None else shape.memory_mib

        def group(table: NodeTable, slots: np.ndarray) -> np.ndarray:
            models = table.feature(GPU_MODEL)[slots]
            free = table.feature(FREE_PCT)[slots]
            cpu = table.feature(CPU_FREE)[slots]
            mem = table.feature(MEMORY_FREE)[slots] // MIB
            step = fragmentation.CPU_BUDGET_STEP_MILLI  # cpu_budget_step, on the columns
            keys_ = [np.zeros(len(slots), np.int64) for _ in range(4)] + [cpu // step, (cpu - need) // step]
            for ident in np.unique(models).tolist():
                cpu_cuts, mem_cuts = self._cuts_of(table.value(GPU_MODEL, ident), mix)
                if max(map(abs, (need, need_mem, *cpu_cuts, *mem_cuts)), default=0) >= _EXACT_INT:
                    return slots  # beyond the clamped columns' exact range: node by node
                chosen = models == ident
                for i, (edges, values) in enumerate(
                    (
                        (cpu_cuts, cpu[chosen]),
                        (cpu_cuts, cpu[chosen] - need),
                        (mem_cuts, mem[chosen]),
                        (mem_cuts, mem[chosen] - need_mem),
                    )
                ):
                    keys_[i][chosen] = np.searchsorted(np.asarray(edges, np.int64), values, side="right")
            return combine_keys([models, free, *keys_])

        return group
