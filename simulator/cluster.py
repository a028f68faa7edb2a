"""The simulated cluster: the production core's `ClusterState`, plus vectorised mirrors of its
per-node summaries for the baselines and the metrics.

Every policy runs on the same model: nodes are `NodeState`s built from Node and Device objects,
pods are `PodRequest`s parsed from Pod objects, device feasibility is the core's `filter`
(verdicts cached per node version and request signature), the devices are chosen by the core's
`allocate` and counted by `assign`. After a placement only that node changed, so its row of the
numpy mirrors (free CPU, memory, pods, per-GPU free share, whole free GPUs, version) is re-read
from its `NodeState`; `resources_fit` and `affinity_matches` run vectorised over those rows
(tests hold them equal to the core's functions). GPU shares are in percent of one GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from allocator.core.cluster.state import ClusterState, affinity_matches
from allocator.core.devices.allocate import Allocation
from allocator.core.node.gpu_features import gpu_model
from allocator.core.node.gpu_summary import GPUSummary
from allocator.core.reasons import Rejection
from allocator.core.request.parse import pod_request
from allocator.core.request.pod_request import PodRequest
from allocator.core.scoring.device import DeviceScoring
from allocator.core.scoring.fragmentation import node_fragment
from allocator.core.scoring.fragmentation_term import task_shape
from allocator.core.scoring.scorer import NodeScorer
from allocator.core.scoring.workload_mix import TaskShape, WorkloadMix
from apis import resources as rn

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

    def request(self, pod: Mapping[str, Any], template: Any = None, gang: str = "") -> SimRequest:
        meta = pod.get("metadata") or {}
        key = f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}"
        req = self._parsed.get(template) if template is not None else None
        if req is None:
            req = pod_request(pod)
            if req.invalid is not None:
                raise SimulationError(f"pod {key}: {req.invalid.message}")
            if template is not None:
                self._parsed[template] = req
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
        self.states = [self.core.nodes[name] for name in names]
        n = self.size = len(names)
        self.models = [gpu_model(s) for s in self.states]
        self.gpu_count = np.array(
            [len(s.inventory.gpu_minors) if s.inventory else 0 for s in self.states], dtype=np.int64
        )
        self.pods_allocatable = np.array(
            [s.allocatable.get(rn.PODS, 1 << 30) for s in self.states], dtype=np.int64
        )
        width = max(int(self.gpu_count.max(initial=0)), 1)
        self.gpu_matrix = np.full((n, width), -1, dtype=np.int64)  # -1: no such GPU (never fits)
        self.gpu_rows: list[tuple[int, ...]] = [()] * n
        self.gpu_free_total = np.zeros(n, dtype=np.int64)
        self.gpu_free_max = np.zeros(n, dtype=np.int64)
        self.gpu_full_count = np.zeros(n, dtype=np.int64)
        self.cpu_capacity = np.array([s.allocatable_cpu_milli for s in self.states], dtype=np.int64)
        self.cpu_free = np.zeros(n, dtype=np.int64)
        self.mem_free = np.zeros(n, dtype=np.int64)
        self.pods_free = np.zeros(n, dtype=np.int64)
        self.version = np.zeros(n, dtype=np.int64)
        self.metrics_mix = metrics_mix
        self.node_frag = np.zeros(n, dtype=np.float64)
        self._affinity: dict[Any, np.ndarray] = {}
        for i in range(n):
            self.refresh(i)
        self.capacity_pct = int(self.gpu_free_total.sum())

    # -- summaries -------------------------------------------------------------------------------
    def refresh(self, i: int) -> None:
        """Re-read node ``i``'s row from its NodeState (after it changed)."""
        s = self.states[i]
        free = GPUSummary.of(s).free_pct
        self.gpu_rows[i] = free
        self.gpu_matrix[i, : len(free)] = free
        self.gpu_free_total[i] = sum(free)
        self.gpu_free_max[i] = max(free, default=0)
        self.gpu_full_count[i] = GPUSummary.of(s).whole_free
        cpu = s.cpu_free_milli
        self.cpu_free[i] = cpu
        self.mem_free[i] = s.memory_free
        self.pods_free[i] = self.pods_allocatable[i] - s.pod_count
        self.version[i] = s.version
        if self.metrics_mix is not None:
            self.node_frag[i] = node_fragment(free, cpu, self.metrics_mix.compiled_for(self.models[i]))

    @property
    def allocated_pct(self) -> int:
        return self.capacity_pct - int(self.gpu_free_total.sum())

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
        candidates = np.flatnonzero(mask).tolist()
        names = self.names
        wanted = [names[i] for i in candidates]
        if not req.pod.wants_devices:
            return Feasible(mask, wanted)
        passed, _ = self.core.feasible(req.pod, wanted)
        if len(passed) != len(wanted):
            mask = np.zeros(self.size, dtype=bool)
            index = self.index
            mask[[index[name] for name in passed]] = True
        return Feasible(mask, passed)

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
        self.refresh(i)

    def unassign(self, req: SimRequest) -> None:
        node = self.core.pod_node.get(req.key)
        if node is not None and self.core.unassign(req.key):
            self.refresh(self.index[node])

    def node_of(self, req: SimRequest) -> int | None:
        node = self.core.pod_node.get(req.key)
        return None if node is None else self.index[node]
