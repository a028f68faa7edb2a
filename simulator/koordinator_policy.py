"""`koordinator`: what a cluster running koord-scheduler with its shipped defaults would do, as a
baseline for topology quality (docs/simulator.md, "Koordinator-default").

Node choice is the score of the default koord-scheduler profile (config/manager/scheduler-config.yaml
in koordinator-sh/koordinator) where it can act in a replay:

* kube-scheduler's NodeResourcesFit, `LeastAllocated` over cpu and memory (weight 1 each, with the
  non-zero request defaults), and NodeResourcesBalancedAllocation over cpu and memory, weight 1 each;
* DeviceShare, weight 1: `scoreNode` per requested device type with DeviceShareArgs' default
  strategy (`LeastAllocated`, weight 1 on gpu-memory-ratio, gpu-memory, rdma, fpga), summed over the
  types and normalised to 100 over the feasible nodes (protocol 7.5);
* the highest sum wins; ties go to a uniformly random top node, as kube-scheduler's selectHost does.

LoadAwareScheduling and NodeNUMAResource score nothing here (no node metrics, no NUMA policy), and
every node is scored (percentageOfNodesToScore samples large clusters; not modelled).

Device choice is the core's implementation of Koordinator's algorithm (partition table with its
bin-pack score, scope walk, plain selection, joint allocation; protocol sections 8 and 9) run on the
node as Koordinator sees it: the PCIe scope is the root bus (`pcieID`; the `pcieSwitchID` that
topoalloc's agent adds is dropped) and there is no NVLink (the `nvlink` field is dropped), i.e.
docs/compatibility.md rows 7 and 9 undone, with the bind path's LeastAllocated device scoring. The
other rows of that table are not undone (the sane behaviour is kept; they rarely decide a
placement here). A node where this emulated allocation fails is skipped as Koordinator's Filter
would skip it.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Mapping, Sequence
from typing import Any

from allocator.core.devices.allocate import allocate as core_allocate
from allocator.core.node.inventory import NodeInventory, build_inventory
from allocator.core.node.state import NodeState
from allocator.core.reasons import Rejection
from allocator.core.scoring.device import DeviceScoring, least_requested
from allocator.core.scoring.scorer import device_share_per_type
from simulator.cluster import Choice, Feasible, SimCluster, SimRequest
from simulator.policies import Policy

MAX_SCORE = 100


def koordinator_view(device: Mapping[str, Any]) -> dict[str, Any]:
    """A Device CR as upstream Koordinator reads it: without the PCIe switch and NVLink facts."""
    out = copy.deepcopy(dict(device))
    for dev in (out.get("spec") or {}).get("devices") or []:
        dev.pop("nvlink", None)
        topo = dev.get("topology")
        if isinstance(topo, dict):
            topo.pop("pcieSwitchID", None)
    return out


def fit_score(state: NodeState, req: SimRequest) -> int:
    """NodeResourcesFit LeastAllocated over cpu and memory (non-zero requests), weight 1 each."""
    pod = req.pod
    cpu = least_requested(state.nonzero_cpu_milli + pod.nonzero_cpu_milli, state.allocatable_cpu_milli)
    mem = least_requested(state.nonzero_memory + pod.nonzero_memory, state.allocatable_memory)
    return (cpu + mem) // 2


def balanced_score(state: NodeState, req: SimRequest) -> int:
    """NodeResourcesBalancedAllocation over cpu and memory: 100 × (1 − the SD of the two
    requested fractions)."""
    pod = req.pod
    fractions = []
    for used, cap in (
        (state.requested_cpu_milli + pod.cpu_milli, state.allocatable_cpu_milli),
        (state.requested_memory + pod.memory, state.allocatable_memory),
    ):
        fractions.append(min(used / cap, 1.0) if cap else 1.0)
    sd = abs(fractions[0] - fractions[1]) / 2
    return int((1.0 - sd) * MAX_SCORE)


def device_share_raw(state: NodeState, req: SimRequest, scoring: DeviceScoring) -> int:
    """DeviceShare's Score before normalisation: `scoreNode` summed over the requested types."""
    return sum(device_share_per_type(state, req.pod, scoring))


class KoordinatorPolicy(Policy):
    """koord-scheduler's default scoring and Koordinator's device allocation (module docstring)."""

    name = "koordinator"

    def __init__(self, rank: Sequence[int], rng: random.Random, scoring: DeviceScoring | None = None) -> None:
        super().__init__(rank, rng)
        self.scoring = scoring or DeviceScoring()
        self._inventories: list[NodeInventory | None] = []
        self._shadows: dict[int, tuple[int, NodeState]] = {}
        self._scores: dict[tuple[int, int], tuple[int, int, int]] = {}  # (shape, node) -> version, kube, dev
        self.fallbacks = 0  # placements where no node allocated under Koordinator's view

    def attach(self, cluster: SimCluster) -> None:
        self._inventories = [
            None if state.inventory is None else koordinator_inventory(state.labels, cluster, state.name)
            for state in cluster.states
        ]

    def shadow(self, cluster: SimCluster, node: int) -> NodeState:
        """Node ``node`` as Koordinator sees it, with the pods the cluster counts there."""
        real = cluster.states[node]
        hit = self._shadows.get(node)
        if hit is not None and hit[0] == real.version:
            return hit[1]
        state = NodeState(real.name, self._inventories[node], real.labels, real.allocatable)
        for pod in real.pods.values():
            state.add_usage(pod)
        self._shadows[node] = (real.version, state)
        return state

    def _components(self, cluster: SimCluster, node: int, req: SimRequest) -> tuple[int, int]:
        key = (req.shape_id, node)
        state = cluster.states[node]
        hit = self._scores.get(key)
        if hit is not None and hit[0] == state.version:
            return hit[1], hit[2]
        kube = fit_score(state, req) + balanced_score(state, req)
        dev = device_share_raw(state, req, self.scoring) if req.pod.devices else 0
        self._scores[key] = (state.version, kube, dev)
        return kube, dev

    def ranked(self, cluster: SimCluster, req: SimRequest, feasible: Feasible) -> list[int]:
        """Feasible nodes, best total score first; equal scores in a random order."""
        nodes = [cluster.index[name] for name in feasible.names]
        parts = [self._components(cluster, n, req) for n in nodes]
        top = max((d for _, d in parts), default=0)
        totals = [k + (d * MAX_SCORE // top if top else 0) for k, d in parts]
        keys = [self.rng.random() for _ in nodes]
        order = sorted(range(len(nodes)), key=lambda i: (-totals[i], keys[i]))
        return [nodes[i] for i in order]

    def select(self, cluster: SimCluster, req: SimRequest, feasible: Feasible) -> Choice:
        """The best-ranked node where Koordinator's view allocates, with those devices; else the
        best-ranked node, where the core allocates with `scoring`."""
        ranked = self.ranked(cluster, req, feasible)
        if not req.pod.wants_devices:
            return Choice(ranked[0])
        for node in ranked:
            result = core_allocate(self.shadow(cluster, node), req.pod, scoring=self.scoring)
            if not isinstance(result, Rejection):
                return Choice(node, allocation=result)
        self.fallbacks += 1
        return Choice(ranked[0])


def koordinator_inventory(labels: Mapping[str, str], cluster: SimCluster, name: str) -> NodeInventory:
    """The inventory built from the node's Device as upstream Koordinator reads it."""
    device = cluster.devices.get(name)
    if device is None:
        raise ValueError(f"{name}: the cluster has no Device object for a node with devices")
    return build_inventory(koordinator_view(device), labels)
