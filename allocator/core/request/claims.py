"""A pod's ResourceClaims as one core request: what the extender path reads from device resources
and annotations, here read from claims (docs/dra.md, "Allocation").

`classify` says whose a claim is: topoalloc's (every request names one of its DeviceClasses with
features it allocates), another driver's, one left to kube-scheduler's own allocation (opted out,
`allocationMode: All`, `adminAccess`, `firstAvailable`, or mixed with other drivers' classes), or
refused (capacity other than one GPU's share, opaque configuration). `translate` turns the pod's
claims of topoalloc's into a `ClaimsRequest`: a `PodRequest` for all their devices together (whole
GPUs or one GPU share as the device-plugin path asks it, whole NICs or VFs, the GPU scope or
partition a `matchAttribute` names, the joint GPU-NIC allocation: required on one switch where a
GPU-NIC `matchAttribute` on `pcieSwitch` asks for it, else the NICs behind the chosen GPUs'
switches preferred), the request slots results are written for, and the constraints every answer
is checked against before anything is written (allocator/core/claims/).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final

from allocator.core.reasons import Rejection
from allocator.core.request.cel import Program, SelectorError, program
from allocator.core.request.parse import gpu_requirement, with_signature
from allocator.core.request.pod_request import PodRequest, as_resources
from apis import dra
from apis import resources as rn
from apis.annotations import DeviceHint, GPUPartitionSpec
from apis.dra_capacity import Amounts
from apis.dra_claims import ALL, ClaimSpec, DeviceClass, ExactRequest
from apis.dra_taints import DeviceToleration
from apis.selector import LabelSelector

OURS: Final = "ours"
FOREIGN: Final = "foreign"  # no request names a topoalloc class
LEAVE: Final = "leave"  # kube-scheduler allocates it
REFUSE: Final = "refuse"  # nobody will: the pod waits with the reason

# Reason codes of claim rejections (Events and `topoalloc allocate`).
CLAIM_REFUSED: Final = "topoalloc: claim refused"
CLAIM_CLASS: Final = "topoalloc: DeviceClass missing"
CLAIM_SELECTOR: Final = "topoalloc: unsupported selector"
CLAIM_MIXED: Final = "topoalloc: devices asked both ways"

PCIE_SWITCH: Final = dra.qualified(dra.ATTR_PCIE_SWITCH)
SOCKET: Final = dra.qualified(dra.ATTR_SOCKET)
NVLINK_DOMAIN: Final = dra.qualified(dra.ATTR_NVLINK_DOMAIN)
# Attributes a GPU and a NIC share a value of when they sit together: a constraint on one of them
# across GPU and NIC requests is the joint allocation.
LOCALITY: Final = (PCIE_SWITCH, dra.PCIE_ROOT, dra.NUMA_NODE, SOCKET)
# The GPU scope of the core's scope walk that a constraint over all the pod's GPUs names exactly.
GPU_SCOPES: Final = {PCIE_SWITCH: "PCIe", dra.NUMA_NODE: "NUMANode"}

GPU, RDMA = rn.DeviceType.GPU, rn.DeviceType.RDMA


@dataclass(frozen=True, slots=True)
class ClaimVerdict:
    kind: str  # OURS, FOREIGN, LEAVE or REFUSE
    reason: str = ""


def classify(spec: ClaimSpec, *, opted_out: bool) -> ClaimVerdict:
    """Whose allocation a claim is (see the module docstring)."""
    if not spec.classes & set(dra.CLASSES):
        return ClaimVerdict(FOREIGN)
    if opted_out:
        return ClaimVerdict(
            LEAVE, f"the claim opts out ({dra.ALLOCATOR_ANNOTATION}: {dra.ALLOCATOR_KUBE_SCHEDULER})"
        )
    for r in spec.requests:
        e = r.exactly
        if e is None:
            return ClaimVerdict(LEAVE, f"request {r.name} uses firstAvailable")
        if e.device_class not in dra.CLASSES:
            return ClaimVerdict(
                LEAVE, f"request {r.name} asks for {e.device_class}, not a topoalloc.io DeviceClass"
            )
        if e.mode == ALL:
            return ClaimVerdict(LEAVE, f"request {r.name} uses allocationMode All")
        if e.admin_access:
            return ClaimVerdict(LEAVE, f"request {r.name} uses adminAccess")
        if e.capacity and (why := share_refusal(e)) is not None:
            return ClaimVerdict(REFUSE, f"request {r.name} asks for capacity: {why}")
    for c in spec.config:
        return ClaimVerdict(
            REFUSE, f"the claim carries opaque config for driver {c.driver}: topoalloc.io takes no parameters"
        )
    return ClaimVerdict(OURS)


SHARE_NAMES: Final = (dra.CAPACITY_CORES, dra.CAPACITY_MEMORY)


def share_refusal(e: ExactRequest) -> str | None:
    """Why a request asking capacity is not a GPU share topoalloc allocates; None when it is one:
    one GPU (count 1) of its class, `cores` (percent, 1 to 100) and/or `memory` (bytes)."""
    if e.device_class != dra.GPU_CLASS:
        return "RDMA NICs and VFs are handed out whole"
    if e.count != 1:
        return (
            f"a GPU share is one GPU (count 1, not {e.count}): ask for several GPUs whole, or one share"
            " per request of its own claim"
        )
    asked = dict(e.capacity)
    other = sorted(set(asked) - set(SHARE_NAMES))
    if other:
        return f"topoalloc.io GPUs offer {' and '.join(SHARE_NAMES)}, not {', '.join(other)}"
    cores = asked.get(dra.CAPACITY_CORES)
    if cores is not None and not 0 < cores.milli_value() <= 1000 * dra.GPU_CORES:
        return (
            f"{dra.CAPACITY_CORES} is a percentage of one GPU's compute, 1 to {dra.GPU_CORES} (got {cores})"
        )
    memory = asked.get(dra.CAPACITY_MEMORY)
    if memory is not None and memory.milli_value() <= 0:
        return f"{dra.CAPACITY_MEMORY} must be more than 0 (got {memory})"
    return None


@dataclass(frozen=True, slots=True)
class RequestSlot:
    """One request of one claim: the results written for it name `count` devices of `kind`."""

    claim: str  # the claim's key (namespace/name)
    request: str
    kind: str  # dra.TYPE_GPU, TYPE_RDMA or TYPE_RDMA_VF
    count: int
    selectors: tuple[Program, ...]  # the class's and the request's, ANDed
    tolerations: tuple[DeviceToleration, ...] = ()  # of the device taints (apis/dra_taints.py)
    capacity: Amounts = ()  # a GPU share's capacity.requests (share_refusal: one GPU)


@dataclass(frozen=True, slots=True)
class ClaimConstraint:
    """A claim's matchAttribute (or distinctAttribute) over some of its request slots."""

    slots: tuple[int, ...]  # indexes into ClaimsRequest.slots
    attribute: str
    distinct: bool = False


@dataclass(frozen=True)
class ClaimsRequest:
    pod: PodRequest  # the core's request for all the devices together
    slots: tuple[RequestSlot, ...]
    constraints: tuple[ClaimConstraint, ...]
    claims: tuple[str, ...]
    # The one matchAttribute over all the pod's GPUs the core has no notion of (nvlinkDomain,
    # socket, ...): the solver may try the GPUs of one value at a time.
    regroup: ClaimConstraint | None = None
    # matchAttributes pairing GPUs with NICs on a locality attribute (the joint allocation).
    pairs: tuple[ClaimConstraint, ...] = ()

    def count(self, kind: str) -> int:
        return sum(s.count for s in self.slots if s.kind == kind)


def translate(
    pod: PodRequest, claims: Sequence[tuple[str, ClaimSpec]], classes: Mapping[str, DeviceClass]
) -> ClaimsRequest | Rejection:
    """The core request for the pod's claims of topoalloc's (each `classify`d OURS), or why none can
    be made (a claim naming a missing class, a selector that cannot be evaluated, ...)."""
    if pod.invalid is not None:
        return pod.invalid
    if pod.devices:
        return Rejection(
            CLAIM_MIXED,
            "the pod asks for device resources and for ResourceClaims of topoalloc.io: use one or the other",
            True,
        )
    slots: list[RequestSlot] = []
    constraints: list[ClaimConstraint] = []
    for key, spec in claims:
        index: dict[str, int] = {}
        for r in spec.requests:
            e = r.exactly
            assert e is not None, "translate takes claims classified OURS"
            cls = classes.get(e.device_class)
            if cls is None:
                return Rejection(CLAIM_CLASS, f"claim {key}: DeviceClass {e.device_class} does not exist")
            if cls.config_drivers:
                return Rejection(
                    CLAIM_REFUSED,
                    f"DeviceClass {cls.name} carries opaque config for {', '.join(cls.config_drivers)}: "
                    "topoalloc.io takes no parameters",
                    True,
                )
            try:
                programs = tuple(program(s) for s in (*cls.selectors, *e.selectors))
            except SelectorError as exc:
                return Rejection(CLAIM_SELECTOR, f"claim {key}, request {r.name}: {exc}", True)
            index[r.name] = len(slots)
            slots.append(
                RequestSlot(
                    key, r.name, dra.CLASS_TYPE[e.device_class], e.count, programs, e.tolerations, e.capacity
                )
            )
        for c in spec.constraints:
            members = tuple(index[n] for n in (c.requests or tuple(index)))
            constraints.append(
                ClaimConstraint(
                    members, c.match_attribute or c.distinct_attribute, bool(c.distinct_attribute)
                )
            )
    return _core_request(pod, tuple(slots), tuple(constraints), tuple(k for k, _ in claims))


def _core_request(
    pod: PodRequest,
    slots: tuple[RequestSlot, ...],
    constraints: tuple[ClaimConstraint, ...],
    keys: tuple[str, ...],
) -> ClaimsRequest | Rejection:
    counts = {kind: sum(s.count for s in slots if s.kind == kind) for kind in dra.CLASS_TYPE.values()}
    nics, vfs = counts[dra.TYPE_RDMA], counts[dra.TYPE_RDMA_VF]
    if nics and vfs:
        return Rejection(
            CLAIM_REFUSED,
            "the pod's claims ask for whole RDMA NICs and for VFs: topoalloc allocates one or the other",
            True,
        )
    gpu_slots = {i for i, s in enumerate(slots) if s.kind == dra.TYPE_GPU}
    nic_slots = {i for i, s in enumerate(slots) if s.kind != dra.TYPE_GPU}
    matches = [c for c in constraints if not c.distinct]
    gpu_groups = [c for c in matches if gpu_slots & set(c.slots)]
    pairs = tuple(c for c in gpu_groups if nic_slots & set(c.slots) and c.attribute in LOCALITY)
    devices: list[tuple[str, tuple[tuple[str, int], ...]]] = []
    hints: dict[str, DeviceHint] = {}
    fields: dict[str, object] = {}
    regroup = None
    gpus = counts[dra.TYPE_GPU]
    share = next((s for s in slots if s.capacity), None)
    if share is not None and gpus > 1:
        return Rejection(
            CLAIM_REFUSED,
            f"the pod's claims ask for a GPU share (claim {share.claim}, request {share.request}) and"
            f" {gpus - 1} GPU(s) more: a pod's GPU share is its only GPU",
            True,
        )
    if gpus:
        gpu = as_resources(
            {rn.GPU_CORE: 100 * gpus, rn.GPU_MEMORY_RATIO: 100 * gpus}
            if share is None
            else share_resources(share)
        )
        devices.append((GPU, gpu))
        spec = None
        whole = gpu_groups[0] if len(gpu_groups) == 1 and gpu_slots <= set(gpu_groups[0].slots) else None
        if whole is not None and gpus > 1:
            attr = whole.attribute
            if attr in GPU_SCOPES:
                hints[GPU] = DeviceHint(required_topology_scope=GPU_SCOPES[attr])
            elif _partition_size(attr) == gpus:
                # One partition of N GPUs of the node's table (NVLink or PCIe: the GPUs that carry
                # the attribute bound the candidates).
                spec = GPUPartitionSpec("Restricted")
            else:
                regroup = whole
        fields["gpu"] = gpu_requirement(dict(gpu), hints.get(GPU), spec)
        fields["partition_spec"] = spec
    if nics:
        devices.append((RDMA, ((rn.RDMA, 100 * nics),)))
    elif vfs:
        devices.append((RDMA, ((rn.RDMA, vfs),)))
        hints[RDMA] = DeviceHint(
            vf_selector=LabelSelector(), allocate_strategy="RequestsAsCount" if vfs > 1 else ""
        )
    if gpus and (nics or vfs):
        # NICs go next to the chosen GPUs: required on one switch when a constraint pairs them
        # there, preferred (the GPUs' switches first) otherwise.
        fields["joint_types"] = (GPU, RDMA)
        fields["joint_same_pcie"] = any(c.attribute == PCIE_SWITCH for c in pairs)
    core = with_signature(replace(pod, devices=tuple(devices), hints=hints, **fields))  # type: ignore[arg-type]
    return ClaimsRequest(core, slots, constraints, keys, regroup, pairs)


def share_resources(slot: RequestSlot) -> dict[str, int]:
    """A GPU share's request in the device-plugin path's terms (Koordinator's gpu-core and
    gpu-memory): what is not asked is the whole GPU (the sharable GPU's defaults), so a share that
    asks memory only takes all the compute."""
    asked = dict(slot.capacity)
    cores = asked.get(dra.CAPACITY_CORES)
    memory = asked.get(dra.CAPACITY_MEMORY)
    out = {rn.GPU_CORE: dra.GPU_CORES if cores is None else cores.value()}
    if memory is None:
        out[rn.GPU_MEMORY_RATIO] = 100
    else:
        out[rn.GPU_MEMORY] = memory.value()
    return out


def _partition_size(attribute: str) -> int:
    """N of `topoalloc.io/nvlinkPartition<N>` or `topoalloc.io/pciePartition<N>`; 0 for any other."""
    found = dra.partition_of(attribute) if attribute.startswith(f"{dra.DRIVER}/") else None
    return 0 if found is None else found[0]
