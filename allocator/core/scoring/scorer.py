"""The node score for prioritize: a weighted mean of pure components, each 0..100.

Built-in components: `fit` (NodeResourcesFitPlus), `scarce` (ScarceResourceAvoidance), `topology`
(quality of the GPU set), `fragmentation` (FGD's fragmentation growth against a workload mix learned
from placed pods, `fragmentation_term.py`), `device` (Koordinator's DeviceShare score). A component
that does not apply to a pod (None) drops out of the mean. Components plug in (or replace a
built-in) by name: `NodeScorer(config, components={"fragmentation": term})` with any callable
`term(state, req) -> float | None` or an object with `prepare(req)`; a fragmentation term reads only
the node's per-GPU free core share (`GPUSummary.of(state)`), free CPU and memory, GPU model
(`gpu_features.gpu_model(state)`) and healthy GPU count. A weight
whose component does not exist is ignored.

`fine` is the weighted mean itself (0..100): nodes are ranked by it, ties going to a stable
per-node key (`allocator.core.ranking`). `score` is the same rounded to kube-scheduler's 0..10.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from allocator.core.node.state import NodeState
from allocator.core.node.table import NodeTable, combine_keys
from allocator.core.request.pod_request import PodRequest
from allocator.core.scoring.device import DEFAULT_WEIGHTS, LEAST_ALLOCATED, DeviceScoring
from allocator.core.scoring.fit import DEFAULT_FIT, ResourceStrategy, prepare_fit
from allocator.core.scoring.fragmentation_term import (
    FragmentationSettings,
    FragmentationTerm,
    required_gpu_models,
)
from allocator.core.scoring.grouped import GroupedScore
from allocator.core.scoring.scarce import DEFAULT_SCARCE, prepare_scarce
from allocator.core.scoring.topology import prepare_topology_grouped

MAX_PRIORITY = 10  # kube-scheduler's extender priorities are 0..10

# `fit` is off by default: its continuous cpu/memory terms break the ties among nodes of equal
# fragmentation growth that the stable node order should decide, which replay of the openb trace
# shows doubles the unallocated GPU (fit weight 0.1: 9.9% against 4.8% with 0; docs/design/core.md).
# `topology` weighs 2: at 1 the fragmentation term sends 4-GPU pods to 4-GPU boards that they fill
# exactly but split across sockets, where a DGX half would give them NVLink (docs/simulator.md,
# "Allocation quality"); openb nodes carry no topology, so their results do not move.
DEFAULT_WEIGHTS_BY_COMPONENT: Mapping[str, float] = {
    "fit": 0.0,
    "scarce": 1.0,
    "topology": 2.0,
    "fragmentation": 1.0,
    "device": 0.0,
}


ScoreComponent = Callable[[NodeState, PodRequest], "float | None"]


@dataclass(frozen=True)
class ScoringConfig:
    """Weights and per-component settings; `from_dict` takes the service's settings, already
    decoded from YAML (the caller reads the file):

    ```yaml
    weights: {fit: 0, scarce: 1, topology: 2, fragmentation: 1, device: 0}
    fit:
      cpu: {type: LeastAllocated, weight: 1}
      memory: {type: LeastAllocated, weight: 1}
      gpu: {type: MostAllocated, weight: 1}
    scarceResources: [gpu, rdma, fpga]
    fragmentation: {window: 1000, refreshEvery: 200}   # see FragmentationSettings
    deviceScoring:            # DeviceShareArgs.scoringStrategy: the bind-time device choice
      type: LeastAllocated
      resources: [{name: koordinator.sh/gpu-memory-ratio, weight: 1}]
    ```
    """

    weights: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS_BY_COMPONENT))
    fit: Mapping[str, ResourceStrategy] = field(default_factory=lambda: dict(DEFAULT_FIT))
    scarce_resources: tuple[str, ...] = DEFAULT_SCARCE
    device_scoring: DeviceScoring = field(default_factory=DeviceScoring)
    fragmentation: FragmentationSettings = field(default_factory=FragmentationSettings)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> ScoringConfig:
        """Raises ValueError naming the bad field."""
        data = dict(data or {})
        unknown = set(data) - {"weights", "fit", "scarceResources", "deviceScoring", "fragmentation"}
        if unknown:
            raise ValueError(f"unknown scoring settings: {', '.join(sorted(unknown))}")
        weights = dict(DEFAULT_WEIGHTS_BY_COMPONENT)
        for name, value in (data.get("weights") or {}).items():
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise ValueError(f"weights.{name}: expected a number >= 0, got {value!r}")
            weights[str(name)] = float(value)
        fit = dict(DEFAULT_FIT)
        if "fit" in data:
            fit = {}
            for kind, spec in (data["fit"] or {}).items():
                if not isinstance(spec, Mapping):
                    raise ValueError(f"fit.{kind}: expected {{type, weight}}")
                fit[str(kind)] = ResourceStrategy(
                    spec.get("type", LEAST_ALLOCATED), int(spec.get("weight", 1))
                )
        scarce = tuple(str(s) for s in data.get("scarceResources", DEFAULT_SCARCE))
        device = DeviceScoring()
        if data.get("deviceScoring") is not None:
            spec = data["deviceScoring"]
            resources = spec.get("resources")
            device_weights = (
                dict(DEFAULT_WEIGHTS)
                if resources is None
                else {r["name"]: int(r.get("weight", 1)) for r in resources}
            )
            device = DeviceScoring(spec.get("type", LEAST_ALLOCATED), device_weights)
        fragmentation = FragmentationSettings.from_dict(data.get("fragmentation"))
        return cls(weights, fit, scarce, device, fragmentation)

    def to_dict(self) -> dict[str, Any]:
        return {
            "weights": dict(self.weights),
            "fit": {k: {"type": v.type, "weight": v.weight} for k, v in self.fit.items()},
            "scarceResources": list(self.scarce_resources),
            "deviceScoring": {
                "type": self.device_scoring.strategy,
                "resources": [{"name": n, "weight": w} for n, w in self.device_scoring.weights.items()],
            },
            "fragmentation": self.fragmentation.to_dict(),
        }


def device_share_per_type(state: NodeState, req: PodRequest, scoring: DeviceScoring) -> list[int]:
    """Koordinator's DeviceShare `scoreNode` for each requested type the node has devices of."""
    inv = state.inventory
    if inv is None:
        return []
    scores = []
    for dtype, resources in req.devices:
        slots = inv.slots(dtype)
        if not slots:
            continue
        request = req.gpu.per_gpu_map if dtype == "gpu" and req.gpu is not None else dict(resources)
        frees = state.free.get(dtype, {})
        scores.append(
            scoring.score_node(request, (s.total for s in slots), (frees.get(s.minor, {}) for s in slots))
        )
    return scores


def device_share_score(state: NodeState, req: PodRequest, scoring: DeviceScoring) -> float | None:
    """Koordinator's DeviceShare Score: scoreNode per requested type, averaged over the types."""
    scores = device_share_per_type(state, req, scoring)
    return sum(scores) / len(scores) if scores else None


def prepare_device_share(
    req: PodRequest, scoring: DeviceScoring
) -> Callable[[NodeState], float | None] | None:
    if not req.devices:
        return None
    return lambda state: device_share_score(state, req, scoring)


Prepared = Callable[[NodeState], "float | None"]
Preparer = Callable[[PodRequest], "Prepared | None"]

_keys = itertools.count(1)
_PREPARED_CACHE = 256
# At most this many nodes are scored one by one rather than by groups (`fine_grouped`).
_EVALUATE_EACH = 4


class NodeScorer:
    """Scores nodes for one configuration. `key` identifies it in score caches.

    A component is either a plain `component(state, req) -> float | None`, or an object with
    `prepare(req)` returning a per-node `fn(state) -> float | None` (or None when it does not apply
    to that request); preparation runs once per request shape. A component object may also have
    `observe(req)` (told about every placed pod), `version()` (changes when its outside input
    does; `sync` then forgets cached scores; with a true `reads_table` attribute it is called as
    `version(table)` with the cluster's NodeTable) and `preferred_gpus(state, req)` (the GPUs its score
    assumed, for the bind path).

    Unless `components` names it, the `fragmentation` component is a `FragmentationTerm` built
    from `config.fragmentation` (when its weight is positive).
    """

    def __init__(
        self, config: ScoringConfig | None = None, components: Mapping[str, ScoreComponent] | None = None
    ) -> None:
        self.config = config or ScoringConfig()
        cfg = self.config
        self.components: dict[str, Any] = dict(components or {})
        if "fragmentation" not in self.components and cfg.weights.get("fragmentation", 0) > 0:
            self.components["fragmentation"] = FragmentationTerm(cfg.fragmentation)
        # A pod that may run on any GPU model gets no topology credit for GPUs the pods held to a
        # model need (scoring/topology.py, gang_room.py): NVLink constrained gangs need is not
        # worth taking from them.
        spoken = getattr(self.components.get("fragmentation"), "spoken_for", None)
        self._preparers: dict[str, Preparer] = {
            "fit": lambda r: prepare_fit(r, cfg.fit),
            "scarce": lambda r: prepare_scarce(r, cfg.scarce_resources),
            "topology": lambda r: prepare_topology_grouped(r, None if required_gpu_models(r) else spoken),
            "device": lambda r: prepare_device_share(r, cfg.device_scoring),
        }
        for name, component in self.components.items():
            self._preparers[name] = _preparer(component)
        self._active = [
            (name, weight, self._preparers[name])
            for name, weight in cfg.weights.items()
            if weight > 0 and name in self._preparers
        ]
        active = {name for name, _, _ in self._active}
        used = [c for n, c in self.components.items() if n in active]
        self._observers = [c.observe for c in used if callable(getattr(c, "observe", None))]
        self._versioned = [
            (c.version, bool(getattr(c, "reads_table", False)))
            for c in used
            if callable(getattr(c, "version", None))
        ]
        self._preferring = [c.preferred_gpus for c in used if callable(getattr(c, "preferred_gpus", None))]
        self._versions = tuple(v() for v, _ in self._versioned)
        self._prepared: dict[tuple[Any, ...], list[tuple[str, float, Prepared]]] = {}
        self.key = next(_keys)

    def refresh(self) -> None:
        """Forget cached scores: call when a component's outside input changed (e.g. the workload
        mix of a fragmentation term), since node versions alone would not show it."""
        self._prepared.clear()
        self.key = next(_keys)

    def sync(self, table: NodeTable | None = None) -> None:
        """Refresh if a versioned component (the fragmentation term's learned mix, its model
        pressure on `table`'s nodes) changed. `ClusterState` calls it, with its node table,
        before every score or ranking. Components with `reads_table` get `version(table)`."""
        if self._versioned:
            versions = tuple(v(table) if t else v() for v, t in self._versioned)
            if versions != self._versions:
                self._versions = versions
                self.refresh()

    def observe(self, req: PodRequest) -> None:
        """A pod was placed: components that learn from the workload take note
        (`ClusterState.add_observer(scorer.observe)`)."""
        for observe in self._observers:
            observe(req)

    def preferred_gpus(self, state: NodeState, req: PodRequest) -> tuple[int, ...] | None:
        """The GPU minors a component's score assumed for this pod on this node, if any."""
        for prefer in self._preferring:
            gpus = prefer(state, req)
            if gpus:
                return tuple(gpus)
        return None

    def prepare(self, req: PodRequest) -> list[tuple[str, float, Prepared]]:
        """The components that apply to this request shape, specialised for it."""
        hit = self._prepared.get(req.signature)
        if hit is None:
            if len(self._prepared) >= _PREPARED_CACHE:
                self._prepared.clear()
            hit = []
            for name, weight, preparer in self._active:
                fn = preparer(req)
                if fn is not None:
                    hit.append((name, weight, fn))
            self._prepared[req.signature] = hit
        return hit

    def breakdown(self, state: NodeState, req: PodRequest) -> dict[str, float | None]:
        return {name: fn(state) for name, _, fn in self.prepare(req)}

    def fine(self, state: NodeState, req: PodRequest) -> float:
        """0..100: the weighted mean of the components that apply (0 when none does)."""
        return self.fine_prepared(state, self.prepare(req))

    def score(self, state: NodeState, req: PodRequest) -> int:
        """0..10: `fine` rounded."""
        return to_priority(self.fine(state, req))

    @staticmethod
    def fine_prepared(state: NodeState, prepared: list[tuple[str, float, Prepared]]) -> float:
        total = weight_sum = 0.0
        for _, weight, fn in prepared:
            value = fn(state)
            if value is None:
                continue
            total += weight * value
            weight_sum += weight
        return total / weight_sum if weight_sum else 0.0

    @staticmethod
    def fine_grouped(
        table: NodeTable, slots: np.ndarray, prepared: list[tuple[str, float, Prepared]]
    ) -> np.ndarray:
        """`fine_prepared` for the nodes in `slots` (distinct), as float64: evaluated once per group
        of nodes that every component scores alike (`GroupedScore`; a component without groups
        sets every node apart), on the group's first node."""
        if not prepared or not len(slots):
            return np.zeros(len(slots))
        states = table.states
        fine_prepared = NodeScorer.fine_prepared
        if len(slots) <= _EVALUATE_EACH:
            # A node or two changed since the last call (one placement's): finding their groups
            # costs more numpy calls than scoring them, and a group's nodes score alike anyway.
            return np.array([fine_prepared(states[s], prepared) for s in slots.tolist()], np.float64)  # type: ignore[arg-type]
        keys = [fn.group(table, slots) if isinstance(fn, GroupedScore) else slots for _, _, fn in prepared]
        _, first, inverse = np.unique(combine_keys(keys), return_index=True, return_inverse=True)
        values = [fine_prepared(states[slot], prepared) for slot in slots[first].tolist()]  # type: ignore[arg-type]
        return np.array(values, dtype=np.float64)[inverse.reshape(-1)]


def to_priority(fine: float) -> int:
    """A 0..100 score on kube-scheduler's extender scale 0..10, rounded half up."""
    return int(fine * MAX_PRIORITY / 100 + 0.5)


def to_priorities(fine: np.ndarray) -> np.ndarray:
    """`to_priority` of each finite score: the same float operations, truncated the same way."""
    return (fine * MAX_PRIORITY / 100 + 0.5).astype(np.int64)


def _preparer(component: Any) -> Preparer:
    prepare = getattr(component, "prepare", None)
    if callable(prepare):
        return prepare
    return lambda req: lambda state: component(state, req)
