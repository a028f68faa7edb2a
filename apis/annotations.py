"""Pod annotation codecs (protocol sections 3.3-3.5, 4 and 7.6), encoded exactly as Koordinator's Go.

Each `parse_*` takes the annotation's string value and raises CodecError naming the annotation key
and the field inside it; each `to_json` returns the byte-exact Go encoding.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from apis import decode as d
from apis import gojson, keys
from apis.errors import CodecError
from apis.gojson import sorted_map
from apis.quantity import Quantity
from apis.resources import DeviceType
from apis.selector import LabelSelector

# -- device-allocated ---------------------------------------------------------------------------


@dataclass(frozen=True)
class AllocatedVF:
    minor: int = 0
    bus_id: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.minor:  # Go: `json:"minor,omitempty"` on an int
            out["minor"] = self.minor
        if self.bus_id:
            out["busID"] = self.bus_id
        return out


@dataclass
class DeviceAllocation:
    minor: int
    resources: dict[str, Quantity] | None = field(default_factory=dict)
    id: str = ""
    vfs: list[AllocatedVF] = field(default_factory=list)
    gpu_shared_resource_template: str = ""
    # Go writes `"extension":{}` for a non-nil extension with nothing in it; remember that case.
    has_extension: bool = False

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"minor": self.minor}
        out["resources"] = (
            None if self.resources is None else sorted_map({k: str(v) for k, v in self.resources.items()})
        )
        if self.id:
            out["id"] = self.id
        if self.vfs or self.gpu_shared_resource_template or self.has_extension:
            ext: dict[str, Any] = {}
            if self.vfs:
                ext["vfs"] = [vf.to_dict() for vf in self.vfs]
            if self.gpu_shared_resource_template:
                ext["gpuSharedResourceTemplate"] = self.gpu_shared_resource_template
            out["extension"] = ext
        return out


@dataclass
class DeviceAllocations:
    """`scheduling.koordinator.sh/device-allocated`: device type -> allocations in allocation order."""

    by_type: dict[str, list[DeviceAllocation]] = field(default_factory=dict)

    def __getitem__(self, dtype: str) -> list[DeviceAllocation]:
        return self.by_type.get(dtype, [])

    def __bool__(self) -> bool:
        return any(self.by_type.values())

    def minors(self, dtype: str) -> list[int]:
        return [a.minor for a in self.by_type.get(dtype, [])]

    def to_dict(self) -> dict[str, Any]:
        return sorted_map({t: [a.to_dict() for a in allocs] for t, allocs in self.by_type.items()})

    def to_json(self) -> str:
        return gojson.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, value: Any, path: str = keys.DEVICE_ALLOCATED) -> DeviceAllocations:
        data = d.obj(value, path)
        by_type: dict[str, list[DeviceAllocation]] = {}
        for dtype, entries in data.items():
            tpath = d.join(path, dtype)
            if entries is None:
                by_type[dtype] = []
                continue
            if not isinstance(entries, list):
                raise CodecError(tpath, "expected a list of allocations", entries)
            by_type[dtype] = [_allocation(item, d.join(tpath, i)) for i, item in enumerate(entries)]
        return cls(by_type)


def _allocation(value: Any, path: str) -> DeviceAllocation:
    data = d.struct(value, path, ("minor", "resources", "id", "extension"))
    resources: dict[str, Quantity] | None = None
    if data.get("resources") is not None:
        rpath = d.join(path, "resources")
        resources = {
            k: Quantity.parse(v, d.join(rpath, k)) for k, v in d.obj(data["resources"], rpath).items()
        }
    alloc = DeviceAllocation(
        minor=d.integer(data, "minor", path, required=True, minimum=0),
        resources=resources,
        id=d.string(data, "id", path),
    )
    ext = data.get("extension")
    if ext is not None:
        epath = d.join(path, "extension")
        edata = d.struct(ext, epath, ("vfs", "gpuSharedResourceTemplate"))
        alloc.has_extension = True
        alloc.gpu_shared_resource_template = d.string(edata, "gpuSharedResourceTemplate", epath)
        for i, vf in enumerate(d.array(edata, "vfs", epath)):
            vpath = d.join(d.join(epath, "vfs"), i)
            vdata = d.struct(vf, vpath, ("minor", "busID"))
            alloc.vfs.append(
                AllocatedVF(d.integer(vdata, "minor", vpath, minimum=-1), d.string(vdata, "busID", vpath))
            )
    return alloc


def parse_device_allocated(text: str) -> DeviceAllocations:
    return DeviceAllocations.from_dict(gojson.loads(text, keys.DEVICE_ALLOCATED))


def allocated_elsewhere(annotations: Mapping[str, Any], node: str) -> str:
    """The other node a pod's device-allocated annotation was made for, when its `allocated-node`
    annotation names one other than `node` (the node the pod is bound to); "" when the allocation
    applies on `node` (no such annotation: made for the node the pod is bound to)."""
    target = annotations.get(keys.ALLOCATED_NODE)
    return target if isinstance(target, str) and target and target != node else ""


# -- device-allocate-hint -----------------------------------------------------------------------

ALLOCATE_STRATEGIES = ("ApplyForAll", "RequestsAsCount")
TOPOLOGY_SCOPES = {"Device": 4, "PCIe": 3, "NUMANode": 2, "Node": 1}
DEVICE_TYPES = tuple(t.value for t in DeviceType)  # the keys of a hint, the types of a joint allocation
# "PCIExpressLevel" is the name of Koordinator's Go constant; users write it, so accept it as PCIeLevel.
EXCLUSIVE_POLICIES = ("DeviceLevel", "PCIeLevel", "PCIExpressLevel")


@dataclass
class DeviceHint:
    selector: LabelSelector | None = None
    vf_selector: LabelSelector | None = None
    allocate_strategy: str = ""
    required_topology_scope: str = ""
    exclusive_policy: str = ""

    @property
    def scope_level(self) -> int:
        return TOPOLOGY_SCOPES.get(self.required_topology_scope, 0)

    @property
    def pcie_exclusive(self) -> bool:
        return self.exclusive_policy in ("PCIeLevel", "PCIExpressLevel")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.selector is not None:
            out["selector"] = self.selector.to_dict()
        if self.vf_selector is not None:
            out["vfSelector"] = self.vf_selector.to_dict()
        if self.allocate_strategy:
            out["allocateStrategy"] = self.allocate_strategy
        if self.required_topology_scope:
            out["requiredTopologyScope"] = self.required_topology_scope
        if self.exclusive_policy:
            out["exclusivePolicy"] = self.exclusive_policy
        return out


@dataclass
class DeviceAllocateHints:
    by_type: dict[str, DeviceHint | None] = field(default_factory=dict)

    def get(self, dtype: str) -> DeviceHint | None:
        return self.by_type.get(dtype)

    def to_json(self) -> str:
        return gojson.dumps(
            sorted_map({t: None if h is None else h.to_dict() for t, h in self.by_type.items()})
        )


def parse_device_allocate_hint(text: str) -> DeviceAllocateHints:
    path = keys.DEVICE_ALLOCATE_HINT
    data = d.obj(gojson.loads(text, path), path)
    hints: dict[str, DeviceHint | None] = {}
    for dtype, value in data.items():
        hpath = d.join(path, dtype)
        # A hint for a misspelt type ("nic") would be ignored without a word: refused.
        d.one_of(dtype, DEVICE_TYPES, path + " key")
        if value is None:
            hints[dtype] = None
            continue
        hd = d.struct(
            value,
            hpath,
            ("selector", "vfSelector", "allocateStrategy", "requiredTopologyScope", "exclusivePolicy"),
        )
        strategy = d.string(hd, "allocateStrategy", hpath)
        scope = d.string(hd, "requiredTopologyScope", hpath)
        policy = d.string(hd, "exclusivePolicy", hpath)
        if strategy:
            d.one_of(strategy, ALLOCATE_STRATEGIES, d.join(hpath, "allocateStrategy"))
        if scope:
            d.one_of(scope, TOPOLOGY_SCOPES, d.join(hpath, "requiredTopologyScope"))
        if policy:
            d.one_of(policy, EXCLUSIVE_POLICIES, d.join(hpath, "exclusivePolicy"))
        sel, vfsel = hd.get("selector"), hd.get("vfSelector")
        hints[dtype] = DeviceHint(
            selector=None if sel is None else LabelSelector.from_dict(sel, d.join(hpath, "selector")),
            vf_selector=None
            if vfsel is None
            else LabelSelector.from_dict(vfsel, d.join(hpath, "vfSelector")),
            allocate_strategy=strategy,
            required_topology_scope=scope,
            exclusive_policy=policy,
        )
    return DeviceAllocateHints(hints)


# -- device-joint-allocate ----------------------------------------------------------------------

JOINT_SCOPES = ("SamePCIe",)


@dataclass
class DeviceJointAllocate:
    device_types: list[str] = field(default_factory=list)
    required_scope: str = ""

    def to_json(self) -> str:
        out: dict[str, Any] = {}
        if self.device_types:
            out["deviceTypes"] = list(self.device_types)
        if self.required_scope:
            out["requiredScope"] = self.required_scope
        return gojson.dumps(out)


def parse_device_joint_allocate(text: str) -> DeviceJointAllocate:
    path = keys.DEVICE_JOINT_ALLOCATE
    data = d.struct(gojson.loads(text, path), path, ("deviceTypes", "requiredScope"))
    types = d.array(data, "deviceTypes", path)
    for i, t in enumerate(types):
        if not isinstance(t, str) or not t:
            raise CodecError(d.join(d.join(path, "deviceTypes"), i), "expected a device type name", t)
        # Koordinator drops a type the pod does not request, so a misspelt one ("nic") would be
        # dropped without a word and the devices chosen apart: refused, like a misspelt scope.
        d.one_of(t, DEVICE_TYPES, d.join(d.join(path, "deviceTypes"), i))
    scope = d.string(data, "requiredScope", path)
    if scope:
        d.one_of(scope, JOINT_SCOPES, d.join(path, "requiredScope"))
    return DeviceJointAllocate(list(types), scope)


# -- gpu-partition-spec -------------------------------------------------------------------------

PARTITION_ALLOCATE_POLICIES = ("Restricted", "BestEffort")


@dataclass
class GPUPartitionSpec:
    allocate_policy: str = ""  # as written; empty means BestEffort
    ring_bus_bandwidth: Quantity | None = None

    @property
    def restricted(self) -> bool:
        return self.allocate_policy == "Restricted"

    def to_json(self) -> str:
        out: dict[str, Any] = {}
        if self.allocate_policy:
            out["allocatePolicy"] = self.allocate_policy
        if self.ring_bus_bandwidth is not None:
            out["ringBusBandwidth"] = str(self.ring_bus_bandwidth)
        return gojson.dumps(out)


def parse_gpu_partition_spec(text: str) -> GPUPartitionSpec:
    path = keys.GPU_PARTITION_SPEC
    data = d.struct(gojson.loads(text, path), path, ("allocatePolicy", "ringBusBandwidth"))
    policy = d.string(data, "allocatePolicy", path)
    if policy:
        d.one_of(policy, PARTITION_ALLOCATE_POLICIES, d.join(path, "allocatePolicy"))
    bw = data.get("ringBusBandwidth")
    return GPUPartitionSpec(
        policy, None if bw is None else Quantity.parse(bw, d.join(path, "ringBusBandwidth"))
    )


# -- numa-topology-spec -------------------------------------------------------------------------

NUMA_POLICIES = ("", "BestEffort", "Restricted", "SingleNUMANode")
NUMA_EXCLUSIVE = ("Preferred", "Required")


@dataclass
class NUMATopologySpec:
    numa_topology_policy: str = ""
    single_numa_node_exclusive: str = ""

    def to_json(self) -> str:
        out: dict[str, Any] = {}
        if self.numa_topology_policy:
            out["numaTopologyPolicy"] = self.numa_topology_policy
        if self.single_numa_node_exclusive:
            out["singleNUMANodeExclusive"] = self.single_numa_node_exclusive
        return gojson.dumps(out)


def parse_numa_topology_spec(text: str) -> NUMATopologySpec:
    path = keys.NUMA_TOPOLOGY_SPEC
    data = d.struct(gojson.loads(text, path), path, ("numaTopologyPolicy", "singleNUMANodeExclusive"))
    policy = d.one_of(
        d.string(data, "numaTopologyPolicy", path), NUMA_POLICIES, d.join(path, "numaTopologyPolicy")
    )
    excl = d.string(data, "singleNUMANodeExclusive", path)
    if excl:
        d.one_of(excl, NUMA_EXCLUSIVE, d.join(path, "singleNUMANodeExclusive"))
    return NUMATopologySpec(policy, excl)
