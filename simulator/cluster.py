"""The simulated cluster: the production core's `ClusterState`, read through its `NodeTable`.

Every policy runs on the same model: nodes are `NodeState`s built from Node and Device objects,
pods are `PodRequest`s parsed from Pod objects, device feasibility is the core's `filter`
(verdicts cached per node version and request signature), the devices are chosen by the core's
`allocate` and counted by `assign`. The per-node numbers the baselines and the metrics read
(free CPU, memory, pods, per-GPU free share, whole free GPUs, last change) are the core's
NodeTable columns, node index = table slot: a column re-reads only the nodes that changed since
it was last read. `resources_fit` and `affinity_matches` run vectorised over those columns (tests
hold them equal to the core's functions). GPU shares are in percent of one GPU.

A replay step is one call, `place(members, policy)`: the policy is asked which feasible node
(`Chooser.select`) for each member, the core allocates and counts it there, and the step's
answer carries what the replay records (the placements, allocated GPU, fragmentation).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

from allocator.core.cluster.state import ClusterState, affinity_matches
from allocator.core.devices.allocate import Allocation
from allocator.core.node.features import CPU_FREE, MEMORY_FREE, PODS_FREE
from allocator.core.node.gpu_features import (
    FREE_PCT_ROWS,
    GPU_COUNT,
    GPU_FREE_MAX,
    GPU_IDLE_PCT,
    WHOLE_FREE,
    gpu_model,
)
from allocator.core.node.gpu_summary import GPUSummary
from allocator.core.node.state import NodeState
from allocator.core.reasons import Rejection
from allocator.core.request.parse import pod_request
from allocator.core.request.pod_request import PodRequest
from allocator.core.scoring.device import DeviceScoring
from allocator.core.scoring.fragmentation import node_fragment
from allocator.core.scoring.fragmentation_term import task_shape
from allocator.core.scoring.scorer import NodeScorer
from allocator.core.scoring.workload_mix import TaskShape, WorkloadMix

FULL = 100  # a whole GPU, in percent


class SimulationError(RuntimeError):
    """The simulated cluster disagrees with itself (a node that passed the filter cannot
    allocate), or a pod cannot be simulated."""


@dataclass(frozen=True, slots=True)
class SimRequest:
    """One pod as the simulator places it: its key, the core's parsed request, and the task
    shape (cpu, per-GPU share, GPU count, models) the baselines and metrics read. ``shape_id``
    numbers the distinct shapes so policies can cache per shape."""

    key: str
    pod: PodRequest
    shape: TaskShape
    shape_id: int
    affinity: Any = None  # hashable key of nodeSelector + required affinity; None: no constraint
    gang: str = ""  # all-or-nothing group ("" for a lone pod)

    @property
    def cpu_milli(self) -> int:
        return self.pod.cpu_milli

    @property
    def memory(self) -> int:
        return self.pod.memory

    @property
    def gpu_pct(self) -> int:
        return self.shape.gpu_pct

    @property
    def gpu_count(self) -> int:
        return self.shape.gpu_count

    @property
    def models(self) -> tuple[str, ...]:
        return self.shape.gpu_models

    @property
    def demand_pct(self) -> int:
        return self.shape.gpu_pct * self.shape.gpu_count

    @property
    def sharing(self) -> bool:
        return 0 < self.shape.gpu_pct < FULL


class RequestFactory:
    """Parses Pod objects through the core's `pod_request`, once per distinct pod spec (pods of
    one template differ only in name, which no decision reads)."""

    def __init__(self) -> None:
        self._parsed: dict[Any, PodRequest] = {}
        self._shape_ids: dict[TaskShape, int] = {}

    def request(
        self, pod: Mapping[str, Any], template: Any = None, gang: str = "", parsed: PodRequest | None = None
    ) -> SimRequest:
        """`parsed`: the pod's request made elsewhere (a job's DRA claims, simulator/workload.py)."""
        meta = pod.get("metadata") or {}
        key = f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}"
        req = self._parsed.get(template) if template is not None else None
        if req is None:
            req = parsed if parsed is not None else pod_request(pod)
            if req.invalid is not None:
                raise SimulationError(f"pod {key}: {req.invalid.message}")
            if template is not None:
                self._parsed[template] = req
        if req.key != key:  # one parse per template, but each pod its own key (gangs count members)
            req = replace(req, key=key, name=str(meta.get("name", "")))
        shape = task_shape(req)
        if shape is None:
            raise SimulationError(
                f"pod {key}: the simulator models GPU shares in percent of one GPU "
                "(nvidia.com/gpu, or gpu-core with gpu-memory-ratio on one GPU)"
            )
        sid = self._shape_ids.setdefault(shape, len(self._shape_ids))
        affinity = None
        if req.node_selector or req.affinity_terms is not None:
            affinity = (tuple(sorted(req.node_selector.items())), req.affinity_terms)
        return SimRequest(key, req, shape, sid, affinity, gang)


@dataclass(frozen=True, slots=True)
class Feasible:
    """Nodes that can take a pod: a mask over node indices and their names in index order."""

    mask: np.ndarray
    names: list[str]

    def any(self) -> bool:
        return bool(self.names)


@dataclass(frozen=True, slots=True)
class Choice:
    """A policy's answer: the node, and for a shared pod the GPU its rule picked (None: the core's
    pick), or the devices it already chose (the koordinator baseline allocates on its own view)."""

    node: int
    gpus: tuple[int, ...] | None = None
    allocation: Allocation | None = None


class Chooser(Protocol):
    """A policy as the cluster asks it: `select` among the feasible nodes; the core then allocates
    on the chosen node with `scoring` (None: Koordinator's Filter order) and, when given, the
    GPUs `scorer`'s score assumed."""

    scoring: DeviceScoring | None
    scorer: NodeScorer | None

    def select(self, cluster: SimCluster, req: SimRequest, feasible: Feasible) -> Choice: ...


@dataclass(frozen=True, slots=True)
class Placed:
    req: SimRequest
    node: int
    allocation: Allocation
    state: NodeState  # the node it was counted on


@dataclass(frozen=True, slots=True)
class Step:
    """One arrival's outcome: every member placed, or none; then the cluster's allocated GPU (in
    percent of one GPU) and fragmentation (0.0 without a metrics mix)."""

    placed: tuple[Placed, ...]
    allocated_pct: int
    fragmented: float


class SimCluster:
    def __init__(
        self,
        objects: Iterable[tuple[Mapping[str, Any], Mapping[str, Any] | None]],
        *,
        tie_seed: int = 0,
        metrics_mix: WorkloadMix | None = None,
    ) -> None:
        """Nodes from (Node, Device or None) objects, in the given order (= node index)."""
        self.core = ClusterState(tie_seed)
        names = []
        self.devices: dict[str, Mapping[str, Any]] = {}  # node -> its Device object, as given
        for node, device in objects:
            state = self.core.upsert_node(node)
            if device is not None:
                self.core.set_device(device)
                self.devices[state.name] = device
            names.append(state.name)
        self.names = names
        self.index = {name: i for i, name in enumerate(names)}
        self.table = self.core.table
        if [self.table.slots[name] for name in names] != list(range(len(names))):
            raise SimulationError("node names must be distinct (a node's index is its table slot)")
        self.states = [self.core.nodes[name] for name in names]
        self.size = len(names)
        self.models = [gpu_model(s) for s in self.states]  # labels never change in a run
        self.metrics_mix = metrics_mix
        self._fragments = np.zeros(self.size, dtype=np.float64)
        self._fragments_synced = -1
        self._affinity: dict[Any, np.ndarray] = {}
        self.capacity_pct = int(self.gpu_free_total.sum())

    # -- columns (the core's NodeTable) ------------------------------------------------------------
    @property
    def cpu_free(self) -> np.ndarray:
        return self.table.feature(CPU_FREE)[: self.size]

    @property
    def mem_free(self) -> np.ndarray:
        return self.table.feature(MEMORY_FREE)[: self.size]

    @property
    def pods_free(self) -> np.ndarray:
        return self.table.feature(PODS_FREE)[: self.size]

    @property
    def gpu_count(self) -> np.ndarray:
        return self.table.feature(GPU_COUNT)[: self.size]

    @property
    def gpu_free_total(self) -> np.ndarray:
        """Free share of each node's GPUs together, in percent of one GPU."""
        return self.table.feature(GPU_IDLE_PCT)[: self.size]

    @property
    def gpu_free_max(self) -> np.ndarray:
        return self.table.feature(GPU_FREE_MAX)[: self.size]

    @property
    def gpu_full_count(self) -> np.ndarray:
        return self.table.feature(WHOLE_FREE)[: self.size]

    @property
    def gpu_matrix(self) -> np.ndarray:
        """Per node, each GPU's free share (-1 past its last GPU: never fits)."""
        return self.table.rows(FREE_PCT_ROWS)[: self.size]

    @property
    def version(self) -> np.ndarray:
        """Per node, the table's stamp of its last change: it changes exactly when the node does."""
        return self.table.stamp[: self.size]

    def free_pct(self, node: int) -> tuple[int, ...]:
        """Node ``node``'s per-GPU free share, GPUs in minor order."""
        return GPUSummary.of(self.states[node]).free_pct

    @property
    def allocated_pct(self) -> int:
        return self.capacity_pct - int(self.gpu_free_total.sum())

    @property
    def fragmented(self) -> float:
        """The nodes' fragmentation against the metrics mix, summed (0.0 without a mix)."""
        mix, table, values = self.metrics_mix, self.table, self._fragments
        if mix is not None and self._fragments_synced != table.clock:
            for i in table.changed_list(self._fragments_synced):
                state = self.states[i]
                values[i] = node_fragment(
                    GPUSummary.of(state).free_pct, state.cpu_free_milli, mix.compiled_for(self.models[i])
                )
            self._fragments_synced = table.clock
        return float(values.sum())

    def affinity_mask(self, req: SimRequest) -> np.ndarray:
        """The core's `affinity_matches` for every node (labels never change in a run)."""
        mask = self._affinity.get(req.affinity)
        if mask is None:
            mask = np.array([affinity_matches(s, req.pod) for s in self.states], dtype=bool)
            self._affinity[req.affinity] = mask
        return mask

    # -- questions -------------------------------------------------------------------------------
    def fits_mask(self, req: SimRequest) -> np.ndarray:
        """`resources_fit` and `affinity_matches` over all nodes, plus the necessary GPU condition
        (a GPU with the share free, or enough fully free GPUs) that spares the device filter
        nodes it would reject anyway."""
        mask = (self.cpu_free >= req.cpu_milli) & (self.mem_free >= req.memory) & (self.pods_free >= 1)
        if req.gpu_count:
            if req.gpu_pct < FULL:
                mask &= self.gpu_free_max >= req.gpu_pct
            else:
                mask &= self.gpu_full_count >= req.gpu_count
        if req.affinity is not None:
            mask &= self.affinity_mask(req)
        return mask

    def feasible(self, req: SimRequest) -> Feasible:
        """Nodes passing kube-scheduler's checks and the core's device filter."""
        mask = self.fits_mask(req)
        names = self.names
        wanted = [names[i] for i in np.flatnonzero(mask).tolist()]
        if not req.pod.wants_devices:
            return Feasible(mask, wanted)
        passed, _ = self.core.feasible(req.pod, wanted)
        if len(passed) != len(wanted):
            mask = np.zeros(self.size, dtype=bool)
            index = self.index
            mask[[index[name] for name in passed]] = True
        return Feasible(mask, passed)

    # -- a replay step -----------------------------------------------------------------------------
    def place(self, members: Sequence[SimRequest], policy: Chooser) -> Step:
        """Place every member (a lone pod or a gang's members) or none: each on the node the
        policy selects among the feasible ones, with the core's devices there; when one fits
        nowhere, those placed before it are taken back. Observers (the scorer's learned workload
        mix) hear of the members once all are placed."""
        placed: list[Placed] = []
        for req in members:
            feasible = self.feasible(req)
            if not feasible.any():
                for done in reversed(placed):
                    self.unassign(done.req)
                placed = []
                break
            choice = policy.select(self, req, feasible)
            allocation = choice.allocation
            if allocation is None:
                allocation = self.allocate(choice.node, req, choice.gpus, policy.scoring, policy.scorer)
            self.assign(choice.node, req, allocation, observe=False)
            placed.append(Placed(req, choice.node, allocation, self.states[choice.node]))
        for p in placed:
            for observe in self.core.observers:
                observe(p.req.pod)
        return Step(tuple(placed), self.allocated_pct, self.fragmented)

    # -- changes ---------------------------------------------------------------------------------
    def allocate(
        self,
        i: int,
        req: SimRequest,
        prefer: Sequence[int] | None = None,
        scoring: DeviceScoring | None = None,
        scorer: NodeScorer | None = None,
    ) -> Allocation:
        """The core's bind-time device choice on node ``i`` (which passed the filter)."""
        if scorer is not None:
            result = self.core.allocate(req.pod, self.names[i], scoring, scorer=scorer)
        else:
            result = self.core.allocate(req.pod, self.names[i], scoring, prefer=prefer)
        if isinstance(result, Rejection):
            raise SimulationError(f"{req.key} passed the filter on {self.names[i]} but: {result.explained}")
        return result

    def assign(self, i: int, req: SimRequest, allocation: Allocation, *, observe: bool = True) -> None:
        """Count the pod on node ``i``; with ``observe`` the core's observers learn about it."""
        pod = req.pod
        self.core.assign(
            req.key,
            self.names[i],
            allocation.devices if allocation.devices.by_type else None,
            pod.cpu_milli,
            pod.memory,
            nonzero_cpu_milli=pod.nonzero_cpu_milli,
            nonzero_memory=pod.nonzero_memory,
            request=pod if observe else None,
        )

    def unassign(self, req: SimRequest) -> None:
        self.core.unassign(req.key)
