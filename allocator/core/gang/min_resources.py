"""A PodGroup's `spec.minResources` as a cheap necessary check before planning.

`minResources` states what the gang's minimum of members needs in total. If the nodes the gang
may use cannot offer that much even empty (their allocatable, healthy GPUs), or even after every
pod that preemption may remove is gone (what is free plus what those pods hold), no plan can exist
and the gang waits with `InsufficientResources` instead of searching.

Only resources that can be measured without guessing are checked: `cpu`, `memory` and whole GPUs
(`nvidia.com/gpu`, `amd.com/gpu`, `dcu.com/gpu`, counted as healthy cards of the node's
inventory, else as its allocatable's GPUs, `apis.resources.node_gpus`). Any other name is
ignored. Every estimate errs on the side of room (a running gang's member counts as removable on
its own), so the check never refuses a gang the planner could place.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from allocator.core.cluster.state import ClusterState
from allocator.core.node.gpu_summary import GPUSummary
from allocator.core.node.state import NodeState
from apis import resources as rn
from apis.quantity import Quantity

CAPACITY = "capacity"  # more than the nodes offer even empty
AVAILABLE = "available"  # more than is free plus what preemption could free

_MEASURED = (rn.CPU, rn.MEMORY, *rn.WHOLE_GPU_RESOURCES)


@dataclass(frozen=True)
class Shortage:
    resource: str
    wanted: int  # cpu in milli-cores, memory in bytes, GPUs in cards
    have: int
    scope: str  # CAPACITY or AVAILABLE

    @property
    def message(self) -> str:
        if self.scope == CAPACITY:
            where = "the nodes the gang may use have"
        else:
            where = "is free on them or preemption could free"
        wanted, have = _show(self.resource, self.wanted), _show(self.resource, self.have)
        return f"minResources {self.resource}={wanted} is more than {where} ({have})"


def _show(resource: str, amount: int) -> str:
    if resource == rn.CPU:
        return f"{amount}m" if amount % 1000 else str(amount // 1000)
    return str(amount)


def wanted_amounts(min_resources: Mapping[str, Quantity]) -> dict[str, int]:
    """The measured resources of `minResources`, in the units node state counts them."""
    out = {}
    for name, qty in min_resources.items():
        if name in _MEASURED:
            amount = qty.milli_value() if name == rn.CPU else qty.value()
            if amount > 0:
                out[name] = amount
    return out


def _gpu_capacity(state: NodeState) -> int:
    if state.inventory is not None:
        return GPUSummary.of(state).healthy_count
    return rn.node_gpus(state.allocatable)


def _capacity(state: NodeState, resource: str) -> int:
    if resource == rn.CPU:
        return state.allocatable_cpu_milli
    if resource == rn.MEMORY:
        return state.allocatable_memory
    return _gpu_capacity(state)


def _staying(state: NodeState, resource: str, removable: Collection[str]) -> int:
    """What the pods that stay (not in `removable`) take of `resource` on this node."""
    staying = [p for key, p in state.pods.items() if key not in removable]
    if resource == rn.CPU:
        return sum(p.cpu_milli for p in staying)
    if resource == rn.MEMORY:
        return sum(p.memory for p in staying)
    return len({minor for p in staying for dtype, minor, _ in p.used if dtype == rn.DeviceType.GPU})


def min_resources_shortage(
    cluster: ClusterState,
    min_resources: Mapping[str, Quantity],
    names: Iterable[str],
    removable: Collection[str] = (),
) -> Shortage | None:
    """The first measured resource of `min_resources` the nodes `names` cannot offer, or None.

    `removable`: keys of the pods preemption may evict for this gang (empty when it may not);
    their requests count as available.
    """
    wanted = wanted_amounts(min_resources)
    if not wanted:
        return None
    nodes = [cluster.nodes[n] for n in names if n in cluster.nodes]
    for resource in sorted(wanted):
        capacity = sum(_capacity(s, resource) for s in nodes)
        if wanted[resource] > capacity:
            return Shortage(resource, wanted[resource], capacity, CAPACITY)
    for resource in sorted(wanted):
        available = sum(max(0, _capacity(s, resource) - _staying(s, resource, removable)) for s in nodes)
        if wanted[resource] > available:
            return Shortage(resource, wanted[resource], available, AVAILABLE)
    return None
