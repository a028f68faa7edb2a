"""The sentences of shortage rejections, built from counts only so that `fits` (from node
summaries) and `allocate` (from the device walk) say exactly the same thing.

The message names what the pod needs, the same on every node short of it; what this node has
(free counts, the best scope) goes to the rejection's `detail` (`Rejection.explained`)."""

from __future__ import annotations

import functools

from allocator.core import reasons as rs
from allocator.core.node.inventory import LEVEL_NODE, LEVEL_NUMA, LEVEL_PCIE, Scope
from allocator.core.reasons import Rejection, plural
from allocator.core.request.pod_request import GPURequirement
from apis import resources as rn
from apis.annotations import DeviceHint
from apis.quantity import Format, Quantity

_SCOPE_WORDS = {"PCIe": "PCIe switch", "NUMANode": "NUMA node", "Node": "node", "Device": "device"}
_NOUNS = {rn.DeviceType.RDMA: ("RDMA NIC", "RDMA NICs"), rn.DeviceType.FPGA: ("FPGA", "FPGAs")}


def gpu_need(g: GPURequirement) -> str:
    """'4 free GPUs', '1 GPU with 50% compute and 50% memory free', '2 GPUs each with 8Gi memory free'."""
    if g.whole:
        return plural(g.count, "free GPU")
    parts = []
    for name, value in g.per_gpu:
        if name == rn.GPU_CORE:
            parts.append(f"{value}% compute")
        elif name == rn.GPU_MEMORY_RATIO:
            parts.append(f"{value}% memory")
        elif name == rn.GPU_MEMORY:
            parts.append(f"{Quantity.of(value, Format.BINARY_SI)} memory")
        else:
            parts.append(f"{value} {name.rsplit('/', 1)[-1]}")
    what = " and ".join(parts) or "capacity"
    return f"1 GPU with {what} free" if g.count == 1 else f"{g.count} GPUs each with {what} free"


@functools.lru_cache(maxsize=4096)
def gpu_shortage(g: GPURequirement, available: int, *, selector: bool) -> Rejection:
    where = " matching the selector" if selector else ""
    if g.whole:
        verb = "is" if available == 1 else "are"
        text, detail = f"need {plural(g.count, 'free GPU')}{where}", f"{available} {verb} free"
    elif available == 0:
        text, detail = f"need {gpu_need(g)}{where}", "no GPU has that much free"
    else:
        verb = "has" if available == 1 else "have"
        text, detail = f"need {gpu_need(g)}{where}", f"only {available} {verb} that much free"
    return Rejection(rs.INSUFFICIENT_DEVICES.format(type=rn.DeviceType.GPU), text, detail=detail)


def beyond_node(g: GPURequirement, total: int, *, partitions: bool) -> Rejection | None:
    """A pod asking for more GPUs than the node has at all, said as that (not as a free count or
    the partition sizes); no preemption can help. None when the node has enough GPUs."""
    if g.count <= total:
        return None
    code = rs.UNSUPPORTED_GPU_COUNT if partitions else rs.INSUFFICIENT_DEVICES.format(type=rn.DeviceType.GPU)
    return Rejection(
        code, f"need {plural(g.count, 'GPU')}", True, detail=f"the node has {plural(total, 'GPU')}"
    )


def scope_shortage(g: GPURequirement, largest: int, scope: Scope | None) -> Rejection:
    word = _SCOPE_WORDS.get(g.required_scope, g.required_scope)
    detail = f"the largest free set is {largest}"
    if scope is not None and largest > 0:
        detail += f" ({scope_label(scope)})"
    return Rejection(rs.INSUFFICIENT_SCOPED, f"need {gpu_need(g)} within one {word}", detail=detail)


def scope_label(scope: Scope) -> str:
    if scope.level == LEVEL_PCIE:
        return f"switch {scope.name}"
    if scope.level == LEVEL_NUMA:
        return f"NUMA node {scope.name}"
    return "node" if scope.level == LEVEL_NODE else scope.name


def partition_shortage(g: GPURequirement) -> Rejection:
    bandwidth = ""
    if g.ring_bus_bandwidth is not None:
        bw = Quantity(g.ring_bus_bandwidth, Format.BINARY_SI)
        bandwidth = f" with ring bandwidth of at least {bw}"
    within = ""
    if g.required_scope and g.required_scope != "Device":
        within = f" within one {_SCOPE_WORDS.get(g.required_scope, g.required_scope)}"
    text = f"need a free {g.count}-GPU partition{bandwidth}{within}; none is free"
    return Rejection(rs.INSUFFICIENT_PARTITIONS, text)


def type_shortage(
    dtype: str, desired: int, available: int, *, vf: bool, hint: DeviceHint | None
) -> Rejection:
    one, many = _NOUNS.get(dtype, (dtype, dtype + "s"))
    noun = one if desired == 1 else many
    qualifiers = ""
    if vf:
        qualifiers += " with a free VF" if desired == 1 else " each with a free VF"
    if hint is not None and hint.selector is not None:
        qualifiers += " matching the selector"
    verb = "qualifies" if available == 1 else "qualify"
    return Rejection(
        rs.INSUFFICIENT_DEVICES.format(type=dtype),
        f"need {desired} {noun}{qualifiers}",
        detail=f"{available} {verb}",
    )
