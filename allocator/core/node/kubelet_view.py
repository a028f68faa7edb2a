"""A node as kubelet's Topology Manager sees it, per NUMA node: what each device plugin resource has
free and how many CPUs the static CPU manager can still pin (from the labels the agent publishes,
apis/kubelet_policy.py, and the pods counted on the node).

kubelet counts each resource apart: a GPU served whole (`nvidia.com/gpu`) leaves its 100 `gpu-core`
and 100 `koordinator.sh/gpu` IDs free to kubelet, and a GPU partly shared out through `gpu-core` is a
free `nvidia.com/gpu` to kubelet (and its `koordinator.sh/gpu` IDs free). The Topology Manager's
hints come from those counts, not from what the allocator knows is free, so this view keeps
kubelet's. A Reservation's room is no pod to kubelet: the devices and
CPUs it holds are free in kubelet's counts (an owner is counted once it is a pod).

Exclusive CPUs: a Guaranteed pod's whole CPUs are pinned on the NUMA node of its devices (where
kubelet aligned them), the rest, if they do not fit there, on the other NUMA nodes lowest first; a
pod without devices is counted on the lowest NUMA node with room, as the Topology Manager would
have put it. Pure: NodeState in, plain data out; cached per node version.
"""

from __future__ import annotations

import weakref
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

from allocator.core.node.inventory import DeviceSlot
from allocator.core.node.state import NodeState, PodEntry
from allocator.core.request.usage import ROOM_KEY_PREFIX
from apis import resources as rn
from apis.kubelet_policy import (
    CPU_MANAGER_POLICY,
    KUBELET_POLICIES,
    NUMA_CPUS,
    NUMA_TOPOLOGY_POLICY,
    TOPOLOGY_MANAGER_SCOPE,
    parse_numa_cpus,
)

UNITS = 100  # gpu-core and rdma kubelet IDs per device (agent/deviceplugin/inventory.py)
POLICY_OF_LABEL = {label: kubelet for kubelet, label in KUBELET_POLICIES.items() if label}


@dataclass(frozen=True)
class ResourceCounts:
    """One device plugin resource per NUMA node: IDs in all (healthy or not) and free to kubelet."""

    total: Mapping[int, int]
    free: Mapping[int, int]
    free_anywhere: int  # free IDs, those without a NUMA node included
    aligned: bool  # some device has a NUMA node (else kubelet has no preference for it)


@dataclass(frozen=True)
class KubeletView:
    policy: str  # kubelet's name: best-effort, restricted or single-numa-node
    scope: str  # container or pod
    numa_nodes: tuple[int, ...]
    resources: Mapping[str, ResourceCounts]
    cpus_total: Mapping[int, int] = field(default_factory=dict)  # {} without the static CPU manager
    cpus_free: Mapping[int, int] = field(default_factory=dict)

    @property
    def static_cpus(self) -> bool:
        return bool(self.cpus_total)

    def key(self) -> Hashable:
        return (
            self.policy,
            self.scope,
            self.numa_nodes,
            tuple(
                (r, tuple(sorted(c.free.items())), c.free_anywhere) for r, c in sorted(self.resources.items())
            ),
            tuple(sorted(self.cpus_free.items())),
        )


_CACHE: weakref.WeakKeyDictionary[NodeState, tuple[int, KubeletView | None]] = weakref.WeakKeyDictionary()


def policy_label(labels: Mapping[str, str]) -> str:
    """kubelet's Topology Manager policy named by a node's label ("" for none or a value not known)."""
    return POLICY_OF_LABEL.get(labels.get(NUMA_TOPOLOGY_POLICY, ""), "")


def kubelet_view(state: NodeState) -> KubeletView | None:
    """None when the node's kubelet aligns nothing (no policy label) or there is no inventory."""
    if not policy_label(state.labels) or state.inventory is None:
        return None
    cached = _CACHE.get(state)
    if cached is not None and cached[0] == state.version:
        return cached[1]
    view = _build(state)
    _CACHE[state] = (state.version, view)
    return view


def view_key(state: NodeState) -> Hashable:
    """What a filter verdict reads of the view: () on nodes without a policy (the usual case)."""
    view = kubelet_view(state)
    return () if view is None else view.key()


def _build(state: NodeState) -> KubeletView:
    inv = state.inventory
    assert inv is not None
    whole: set[int] = set()
    share: dict[int, int] = {}  # GPU minor -> gpu-core IDs kubelet holds for pods
    koord: dict[int, int] = {}  # GPU minor -> koordinator.sh/gpu IDs kubelet holds for pods
    rdma: dict[int, int] = {}
    for entry in _kubelets_pods(state):
        for dtype, minor, res in entry.used:
            values = dict(res)
            if dtype == rn.DeviceType.GPU:
                if entry.whole_cards:
                    whole.add(minor)
                else:
                    held = koord if entry.koord_shares else share
                    held[minor] = held.get(minor, 0) + values.get(rn.GPU_CORE, 0)
            elif dtype == rn.DeviceType.RDMA:
                rdma[minor] = rdma.get(minor, 0) + values.get(rn.RDMA, 0)
    gpus = inv.devices.get(rn.DeviceType.GPU, ())
    nics = inv.devices.get(rn.DeviceType.RDMA, ())
    resources = {
        rn.NVIDIA_GPU: _counts([(s, 1, 0 if s.minor in whole else 1) for s in gpus]),
        rn.GPU_CORE: _counts([(s, UNITS, UNITS - min(UNITS, share.get(s.minor, 0))) for s in gpus]),
        rn.GPU: _counts([(s, UNITS, UNITS - min(UNITS, koord.get(s.minor, 0))) for s in gpus]),
        rn.RDMA: _counts([(s, UNITS, UNITS - min(UNITS, rdma.get(s.minor, 0))) for s in nics]),
    }
    cpus = (
        parse_numa_cpus(state.labels.get(NUMA_CPUS, ""))
        if state.labels.get(CPU_MANAGER_POLICY) == "static"
        else {}
    )
    nodes = sorted({*cpus, *(s.numa for s in (*gpus, *nics) if s.has_topology and s.numa >= 0)})
    return KubeletView(
        policy_label(state.labels),
        state.labels.get(TOPOLOGY_MANAGER_SCOPE, "container"),
        tuple(nodes),
        resources,
        {n: total for n, (total, _) in cpus.items()},
        _cpus_free(state, cpus),
    )


def _kubelets_pods(state: NodeState) -> list[PodEntry]:
    """The entries kubelet has admitted or will: every one but Reservations' rooms."""
    return [e for key, e in state.pods.items() if not key.startswith(ROOM_KEY_PREFIX)]


def _counts(devices: list[tuple[DeviceSlot, int, int]]) -> ResourceCounts:
    """(slot, IDs, free IDs) per device; unhealthy devices have no free IDs."""
    total: dict[int, int] = {}
    free: dict[int, int] = {}
    anywhere = 0
    aligned = False
    for slot, ids, left in devices:
        numa = slot.numa if slot.has_topology else -1
        left = left if slot.health else 0
        anywhere += left
        if numa < 0:
            continue
        aligned = True
        total[numa] = total.get(numa, 0) + ids
        free[numa] = free.get(numa, 0) + left
    return ResourceCounts(total, free, anywhere, aligned)


def _cpus_free(state: NodeState, cpus: Mapping[int, tuple[int, int]]) -> dict[int, int]:
    """Pinnable CPUs left per NUMA node after the node's Guaranteed pods, in the order they came:
    each on its devices' NUMA node(s) (where kubelet aligned it), or without devices on the lowest
    NUMA node with room; what does not fit there comes from the other nodes, lowest first, as the
    static CPU manager takes aligned CPUs first and then the rest."""
    if not cpus:
        return {}
    free = {n: exclusive for n, (_total, exclusive) in cpus.items()}
    inv = state.inventory
    assert inv is not None
    for entry in _kubelets_pods(state):
        want = entry.exclusive_cpus
        if not want:
            continue
        home = sorted(
            {
                slot.numa
                for dtype, minor, _ in entry.used
                if (slot := inv.by_minor.get(dtype, {}).get(minor)) is not None and slot.numa in free
            }
        )
        if not home:
            home = [next((n for n in sorted(free) if free[n] >= want), min(free))]
        for n in [*home, *(n for n in sorted(free) if n not in home)]:
            taken = min(want, free[n])
            free[n] -= taken
            want -= taken
    return free
