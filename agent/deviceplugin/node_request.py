"""What a pod asks of this node's served devices, when the agent chooses them itself (a pod that
reached the node without an allocation for it: see node_choice.py).

Per container, in spec order, as the device plugin calls name them (`container` is the index among
the containers requesting that resource): its GPUs (`nvidia.com/gpu`: whole GPUs; `gpu-core` or
`koordinator.sh/gpu`: a share of each of `count` GPUs, Koordinator's per-GPU rule) and its RDMA
NICs (`koordinator.sh/rdma`: units of one NIC, 100 = a whole NIC). The pod's `device-allocate-hint`
selectors and `device-joint-allocate` are read as the allocator reads them.

Decisions for a pod no scheduler vetted: `gpu-core` with neither `gpu-memory-ratio` nor
`gpu-memory` takes the memory share equal to the compute share (Koordinator refuses that
combination; refusing it on the node would leave the pod nowhere to go); a pod asking two of
`nvidia.com/gpu`, `gpu-core` and `koordinator.sh/gpu` cannot be served (they would have to be one
annotation's GPUs).

Pure: a pod dict in, plain data out; ExpectationError says why a pod cannot be served.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent.deviceplugin.expectation import ExpectationError, container_requests
from agent.deviceplugin.inventory import GPU_RESOURCES
from apis import keys
from apis import resources as rn
from apis.annotations import parse_device_allocate_hint, parse_device_joint_allocate
from apis.errors import CodecError
from apis.podresources import resource_quantity
from apis.selector import LabelSelector

GPU, RDMA = rn.DeviceType.GPU.value, rn.DeviceType.RDMA.value


@dataclass(frozen=True)
class GpuAsk:
    """One container's GPUs: `count` GPUs, `core` percent of each (100: whole), and of each GPU's
    memory either `ratio` percent or `memory` bytes."""

    container: str
    count: int
    core: int
    ratio: int | None
    memory: int | None

    @property
    def whole(self) -> bool:
        return self.core == 100 and self.ratio == 100


@dataclass(frozen=True)
class NicAsk:
    """One container's RDMA: `count` NICs with `units` percent of each."""

    container: str
    count: int
    units: int


@dataclass(frozen=True)
class PodAsk:
    gpu_resource: str  # one of GPU_RESOURCES; "" when no GPU is asked
    gpus: tuple[GpuAsk, ...]
    nics: tuple[NicAsk, ...]
    gpu_selector: LabelSelector | None = None
    nic_selector: LabelSelector | None = None
    vf_selector: LabelSelector | None = None  # set: each NIC comes with one VF of a matching group
    joint: tuple[str, ...] = ()  # device types chosen together, the first one first
    same_pcie: bool = False  # joint NICs: one on each PCIe switch of the GPUs, required

    def asks(self, resource: str) -> int:
        """How many containers ask `resource`."""
        if resource == rn.RDMA:
            return len(self.nics)
        return len(self.gpus) if resource == self.gpu_resource else 0


def _pod_total(pod: dict[str, Any], name: str) -> int:
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        value = (res.get("requests") or {}).get(name, (res.get("limits") or {}).get(name))
        if value is not None:
            try:
                total += resource_quantity(name, value, f"container {c.get('name', '')!r} {name}").value()
            except CodecError as exc:
                raise ExpectationError(str(exc)) from None
    return total


def _share(resource: str, name: str, core: int, pod: dict[str, Any], alone: bool) -> GpuAsk:
    """A `gpu-core` (or `koordinator.sh/gpu`: compute and memory alike) container's GPUs. `alone`:
    the only container asking it, so the pod's ratio, memory and gpu.shared are its own."""
    ratio = _pod_total(pod, rn.GPU_MEMORY_RATIO) if alone else 0
    memory = _pod_total(pod, rn.GPU_MEMORY) if alone else 0
    shared = _pod_total(pod, rn.GPU_SHARED) if alone else 0
    if not ratio and not memory:
        ratio = core  # memory in proportion to compute (module doc)
    count = shared or (ratio // 100 if ratio > 100 and ratio % 100 == 0 else 1)
    if count == 1 and core > 100 and core % 100 == 0 and not shared:
        count = core // 100
    if core % count or core // count > 100 or (ratio and (ratio % count or ratio // count > 100)):
        raise ExpectationError(
            f"container {name!r}: {resource} {core} (memory ratio {ratio or '-'}) does not split "
            f"over {count} GPUs at most 100 % each"
        )
    return GpuAsk(name, count, core // count, ratio // count if ratio else None, memory // count or None)


def _selector(hints: Any, dtype: str, attr: str) -> LabelSelector | None:
    hint = hints.get(dtype) if hints is not None else None
    return getattr(hint, attr) if hint is not None else None


def pod_ask(pod: dict[str, Any]) -> PodAsk:
    """What the pod's containers ask of the served resources. Raises ExpectationError."""
    asked = {r: got for r in GPU_RESOURCES if (got := container_requests(pod, r))}
    if len(asked) > 1:
        both = "both " if len(asked) == 2 else ""
        raise ExpectationError(f"the pod asks {both}{' and '.join(asked)}: one pod's GPUs are of one kind")
    gpu_resource, requests = next(iter(asked.items()), ("", []))
    gpus: tuple[GpuAsk, ...]
    if gpu_resource == rn.NVIDIA_GPU:
        gpus = tuple(GpuAsk(name, n, 100, 100, None) for name, n in requests)
    else:
        gpus = tuple(_share(gpu_resource, name, n, pod, len(requests) == 1) for name, n in requests)
    nics = []
    for name, units in container_requests(pod, rn.RDMA):
        if units > 100 and units % 100:
            raise ExpectationError(f"container {name!r}: {rn.RDMA} {units} is neither ≤ 100 nor whole NICs")
        nics.append(NicAsk(name, max(1, units // 100), min(units, 100)))
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    hints = None
    joint: tuple[str, ...] = ()
    same_pcie = False
    try:
        if keys.DEVICE_ALLOCATE_HINT in annotations:
            hints = parse_device_allocate_hint(annotations[keys.DEVICE_ALLOCATE_HINT])
        if keys.DEVICE_JOINT_ALLOCATE in annotations:
            spec = parse_device_joint_allocate(annotations[keys.DEVICE_JOINT_ALLOCATE])
            asked = {GPU: bool(gpus), RDMA: bool(nics)}
            # as the allocator cleans the list: types the pod asks, not applied to all devices
            joint = tuple(
                t
                for t in dict.fromkeys(spec.device_types)
                if asked.get(t) and (_selector(hints, t, "allocate_strategy") or "") != "ApplyForAll"
            )
            same_pcie = spec.required_scope == "SamePCIe" and len(joint) > 1
    except CodecError as exc:
        raise ExpectationError(f"malformed annotation: {exc}") from None
    return PodAsk(
        gpu_resource=gpu_resource,
        gpus=gpus,
        nics=tuple(nics),
        gpu_selector=_selector(hints, GPU, "selector"),
        nic_selector=_selector(hints, RDMA, "selector"),
        vf_selector=_selector(hints, RDMA, "vf_selector"),
        joint=joint if len(joint) > 1 else (),
        same_pcie=same_pcie,
    )
