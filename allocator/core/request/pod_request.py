"""The parsed form of a pod's request (`PodRequest`) and its parts; `parse.pod_request` builds it.

`signature` is a hashable key of everything that decides feasibility and scores on a node; verdict
and score caches are keyed by it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from allocator.core.reasons import Rejection
from apis import keys
from apis import resources as rn
from apis.annotations import (
    DeviceAllocations,
    DeviceHint,
    GPUPartitionSpec,
    NUMATopologySpec,
)
from apis.podgroup import GangRef

# Device types in the order we always visit them (Koordinator iterates a Go map).
TYPE_ORDER: tuple[str, ...] = (rn.DeviceType.GPU, rn.DeviceType.RDMA, rn.DeviceType.FPGA)


Resources = tuple[tuple[str, int], ...]  # sorted (name, integer value) pairs: hashable


def as_resources(mapping: Mapping[str, int]) -> Resources:
    return tuple(sorted(mapping.items()))


@dataclass(frozen=True, slots=True)
class GPURequirement:
    """What one GPU of the pod must offer and how many such GPUs (protocol 3.2)."""

    count: int
    per_gpu: Resources
    shared: bool
    honor_partition: bool = False
    restricted_partition: bool = False
    ring_bus_bandwidth: int | None = None  # nano-units, compared exactly
    required_scope: str = ""
    scope_level: int = 0
    whole: bool = False  # whole cards: every GPU fully (100% compute and memory)
    equal_share: int | None = None  # x when per_gpu is exactly {gpu-core: x, gpu-memory-ratio: x}

    @property
    def per_gpu_map(self) -> dict[str, int]:
        return dict(self.per_gpu)


WHOLE_GPU: Resources = as_resources({rn.GPU_CORE: 100, rn.GPU_MEMORY_RATIO: 100})


@dataclass(frozen=True, slots=True)
class SelectorTerm:
    """One nodeSelectorTerm of required node affinity: expressions and fields are ANDed."""

    expressions: tuple[tuple[str, str, tuple[str, ...]], ...] = ()
    fields: tuple[tuple[str, str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class PodRequest:
    key: str = ""
    namespace: str = "default"
    name: str = ""
    uid: str = ""
    invalid: Rejection | None = None
    # Internal per-type device requests (protocol 3.1 step 5), in TYPE_ORDER.
    devices: tuple[tuple[str, Resources], ...] = ()
    gpu: GPURequirement | None = None
    hints: Mapping[str, DeviceHint] = field(default_factory=dict)
    joint_types: tuple[str, ...] = ()  # cleaned: the first one is the primary type
    joint_same_pcie: bool = False
    partition_spec: GPUPartitionSpec | None = None
    numa_spec: NUMATopologySpec | None = None
    isolation_provider: str = ""
    designated: DeviceAllocations | None = None  # a device-allocated annotation already on the pod
    cpu_milli: int = 0
    memory: int = 0
    exclusive_cpus: int = 0  # CPUs kubelet's static CPU manager would pin (request/usage.py)
    nonzero_cpu_milli: int = 0  # with kube-scheduler's per-container defaults, for scoring
    nonzero_memory: int = 0
    scalars: Mapping[str, int] = field(default_factory=dict)  # every other requested resource, in units
    node_selector: Mapping[str, str] = field(default_factory=dict)
    affinity_terms: tuple[SelectorTerm, ...] | None = None  # None: no required node affinity
    gang: GangRef | None = None
    gang_error: str = ""
    rl_job_group: str = ""
    priority: int = 0  # spec.priority: the PriorityClass value the API server resolved (not in signature)
    # What the pod says that topoalloc ignores (apis/pod_checks.py: unknown keys, near-miss
    # resource names), for one Warning Event; not in the signature.
    warnings: tuple[str, ...] = ()
    signature: tuple[Any, ...] = ()

    # -- convenience -------------------------------------------------------------------------
    @property
    def device_types(self) -> tuple[str, ...]:
        return tuple(t for t, _ in self.devices)

    @property
    def wants_devices(self) -> bool:
        return bool(self.devices)

    def device_request(self, dtype: str) -> dict[str, int]:
        for t, r in self.devices:
            if t == dtype:
                return dict(r)
        return {}

    def hint(self, dtype: str) -> DeviceHint | None:
        return self.hints.get(dtype)

    @property
    def has_selectors(self) -> bool:
        return any(h.selector is not None for h in self.hints.values())

    @cached_property
    def plain_gpu(self) -> GPURequirement | None:
        """The GPU requirement of a valid GPU-only request without hints, which node summaries
        decide alone (`allocate.fits` fast path); None for anything else."""
        if self.invalid is None and self.gpu is not None and len(self.devices) == 1 and not self.hints:
            return self.gpu
        return None

    @cached_property
    def requested_kinds(self) -> frozenset[str]:
        """Requested resource kinds: device resources by their type (gpu, rdma, fpga), others by name."""
        return frozenset(str(rn.RESOURCE_DEVICE_TYPE.get(n, n)) for n in self.requested_names)

    @property
    def requested_names(self) -> frozenset[str]:
        """Every resource name the pod requests with a positive amount (cpu/memory included)."""
        names = set(self.scalars)
        if self.cpu_milli:
            names.add(rn.CPU)
        if self.memory:
            names.add(rn.MEMORY)
        return frozenset(names)


def renamed(req: PodRequest, *, key: str, namespace: str, name: str, uid: str) -> PodRequest:
    """`req` for another pod of the same shape (a Job's next pod, a pod taking over the hold made
    for it at admission): a copy with the pod's own key, namespace, name and uid. Faster than
    `dataclasses.replace`, which would run `__init__` again; what the request cached about its
    content (plain_gpu, requested_kinds) stays valid."""
    copy = object.__new__(PodRequest)
    copy.__dict__.update(req.__dict__, key=key, namespace=namespace, name=name, uid=uid)
    return copy


# -- parsing ---------------------------------------------------------------------------------------


def required_gpu_models(req: PodRequest) -> tuple[str, ...]:
    """GPU models the pod accepts through nodeSelector or required node affinity on the
    `node.koordinator.sh/gpu-model` label (empty: any). Affinity terms are ORed, so a model
    restriction holds only when every term carries one."""
    allowed: set[str] | None = None
    chosen = req.node_selector.get(keys.GPU_MODEL)
    if chosen is not None:
        allowed = {chosen}
    terms = req.affinity_terms
    if terms:
        union: set[str] = set()
        for term in terms:
            values = [set(v) for k, op, v in term.expressions if k == keys.GPU_MODEL and op == "In"]
            if not values:
                union = set()
                break
            union |= set.intersection(*values)
        else:
            allowed = union if allowed is None else allowed & union
    return tuple(sorted(allowed)) if allowed else ()
