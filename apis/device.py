"""The Device custom resource (scheduling.koordinator.sh/v1alpha1, cluster-scoped, name = node name).

Field names, order and omission follow Koordinator's Go types, so a Koordinator-written Device
decodes unchanged and ours encodes to what Koordinator would write. topoalloc's additions are
optional and never change the type of an existing field, so our objects still validate against
Koordinator's schema:
  * `topology.pcieSwitchID` – the PCIe switch the device hangs under: the upstream port (BDF) of
    the outermost switch below the root port, so devices sharing it reach each other without
    crossing the host bridge; `pcieID` keeps Koordinator's meaning (the PCI root bus, e.g.
    `pci0000:15`).
  * `topology.pciePath` – the PCI bridges from the root port down to the device's parent (BDFs),
    enough to tell PIX from PXB the way `nvidia-smi topo -m` does.
  * `nvlink` on a GPU – its NVLink domain and direct peers with link counts.
  * `status.devices` – per-device load and health detail, `status.updateTime`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from apis import decode as d
from apis import keys
from apis.errors import CodecError
from apis.gojson import sorted_map
from apis.podresources import device_quantity
from apis.quantity import Quantity
from apis.resources import DeviceType

GROUP = "scheduling.koordinator.sh"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "Device"
PLURAL = "devices"

NUMA_UNKNOWN = -1
KNOWN_TYPES: tuple[str, ...] = tuple(DeviceType)
_UNKNOWN_TYPE = f"unknown device type (known: {', '.join(KNOWN_TYPES)})"


@dataclass
class DeviceTopology:
    socket_id: int = -1
    node_id: int = NUMA_UNKNOWN
    pcie_id: str = ""
    bus_id: str = ""
    pcie_switch_id: str = ""  # topoalloc extra
    pcie_path: list[str] = field(default_factory=list)  # topoalloc extra

    FIELDS = ("socketID", "nodeID", "pcieID", "busID", "pcieSwitchID", "pciePath")

    @classmethod
    def from_dict(cls, value: Any, path: str) -> DeviceTopology:
        data = d.struct(value, path, cls.FIELDS)
        return cls(
            socket_id=d.integer(data, "socketID", path, default=0, minimum=-1),
            node_id=d.integer(data, "nodeID", path, default=0, minimum=-1),
            pcie_id=d.string(data, "pcieID", path),
            bus_id=d.string(data, "busID", path),
            pcie_switch_id=d.string(data, "pcieSwitchID", path),
            pcie_path=[
                _bridge(v, d.join(d.join(path, "pciePath"), i))
                for i, v in enumerate(d.array(data, "pciePath", path))
            ],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"socketID": self.socket_id, "nodeID": self.node_id, "pcieID": self.pcie_id}
        if self.bus_id:
            out["busID"] = self.bus_id
        if self.pcie_switch_id:
            out["pcieSwitchID"] = self.pcie_switch_id
        if self.pcie_path:
            out["pciePath"] = list(self.pcie_path)
        return out

    @property
    def pcie_scope(self) -> str:
        """The tightest known PCIe scope: the real switch when the CR carries it, else the root bus."""
        return self.pcie_switch_id or self.pcie_id


def _bridge(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value:
        raise CodecError(path, "expected a PCI bridge address such as 0000:16:00.0", value)
    return value


@dataclass(frozen=True)
class VirtualFunction:
    minor: int
    bus_id: str = ""

    @classmethod
    def from_dict(cls, value: Any, path: str) -> VirtualFunction:
        data = d.struct(value, path, ("minor", "busID"))
        return cls(d.integer(data, "minor", path, default=0, minimum=-1), d.string(data, "busID", path))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"minor": self.minor}
        if self.bus_id:
            out["busID"] = self.bus_id
        return out


@dataclass
class VirtualFunctionGroup:
    labels: dict[str, str] = field(default_factory=dict)
    vfs: list[VirtualFunction] = field(default_factory=list)

    @classmethod
    def from_dict(cls, value: Any, path: str) -> VirtualFunctionGroup:
        data = d.struct(value, path, ("labels", "vfs"))
        vfs = [
            VirtualFunction.from_dict(v, d.join(d.join(path, "vfs"), i))
            for i, v in enumerate(d.array(data, "vfs", path))
        ]
        return cls(d.str_map(data, "labels", path), vfs)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.labels:
            out["labels"] = sorted_map(self.labels)
        if self.vfs:
            out["vfs"] = [vf.to_dict() for vf in self.vfs]
        return out


@dataclass
class Condition:
    """metav1.Condition."""

    type: str
    status: str
    reason: str
    message: str = ""
    last_transition_time: str = ""
    observed_generation: int = 0

    STATUSES = ("True", "False", "Unknown")

    @classmethod
    def from_dict(cls, value: Any, path: str) -> Condition:
        data = d.struct(
            value, path, ("type", "status", "observedGeneration", "lastTransitionTime", "reason", "message")
        )
        return cls(
            type=d.string(data, "type", path, required=True),
            status=d.one_of(
                d.string(data, "status", path, required=True), cls.STATUSES, d.join(path, "status")
            ),
            reason=d.string(data, "reason", path),
            message=d.string(data, "message", path),
            last_transition_time=d.string(data, "lastTransitionTime", path),
            observed_generation=d.integer(
                data, "observedGeneration", path, default=0, minimum=0, maximum=2**63 - 1
            ),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "status": self.status}
        if self.observed_generation:
            out["observedGeneration"] = self.observed_generation
        out["lastTransitionTime"] = self.last_transition_time or None
        out["reason"] = self.reason
        out["message"] = self.message
        return out


@dataclass(frozen=True)
class NVLinkPeer:
    minor: int
    links: int

    def to_dict(self) -> dict[str, Any]:
        return {"minor": self.minor, "links": self.links}


@dataclass
class NVLinkInfo:
    """A GPU's NVLink facts (topoalloc extra). GPUs that reach each other over NVLink, directly or
    through NVSwitch, share a `domain`. Through NVSwitch every other GPU of the domain is a peer and
    `links` is this GPU's NVLink count into the switch fabric."""

    domain: str
    peers: list[NVLinkPeer] = field(default_factory=list)
    nvswitch: bool = False

    @classmethod
    def from_dict(cls, value: Any, path: str) -> NVLinkInfo:
        data = d.struct(value, path, ("domain", "peers", "nvswitch"))
        peers = []
        for i, item in enumerate(d.array(data, "peers", path)):
            ppath = d.join(d.join(path, "peers"), i)
            pd = d.struct(item, ppath, ("minor", "links"))
            peers.append(
                NVLinkPeer(
                    d.integer(pd, "minor", ppath, required=True, minimum=0),
                    d.integer(pd, "links", ppath, required=True, minimum=0),
                )
            )
        return cls(d.string(data, "domain", path, required=True), peers, d.boolean(data, "nvswitch", path))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"domain": self.domain}
        if self.peers:
            out["peers"] = [p.to_dict() for p in self.peers]
        if self.nvswitch:
            out["nvswitch"] = True
        return out


@dataclass
class DeviceInfo:
    type: str
    minor: int
    health: bool = False
    id: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    module_id: int | None = None
    resources: dict[str, Quantity] = field(default_factory=dict)
    topology: DeviceTopology | None = None
    vf_groups: list[VirtualFunctionGroup] = field(default_factory=list)
    conditions: list[Condition] = field(default_factory=list)
    nvlink: NVLinkInfo | None = None  # topoalloc extra, GPUs only

    FIELDS = (
        "type",
        "labels",
        "id",
        "minor",
        "moduleID",
        "health",
        "resources",
        "topology",
        "vfGroups",
        "conditions",
        "nvlink",
    )

    @classmethod
    def from_dict(cls, value: Any, path: str) -> DeviceInfo:
        data = d.struct(value, path, cls.FIELDS)
        dtype = d.string(data, "type", path, required=True)
        if dtype not in KNOWN_TYPES:
            # A typo ('GPU', 'gpus') would otherwise drop the node's devices without a word.
            raise CodecError(d.join(path, "type"), _UNKNOWN_TYPE, dtype)
        resources = {}
        rpath = d.join(path, "resources")
        for name, qty in d.obj(data.get("resources") or {}, rpath).items():
            resources[name] = device_quantity(name, qty, d.join(rpath, name))
        topo = data.get("topology")
        nvlink = data.get("nvlink")
        return cls(
            type=dtype,
            minor=d.integer(data, "minor", path, required=True, minimum=0),
            health=d.boolean(data, "health", path),
            id=d.string(data, "id", path),
            labels=d.str_map(data, "labels", path),
            module_id=d.integer(data, "moduleID", path, default=None),
            resources=resources,
            topology=None if topo is None else DeviceTopology.from_dict(topo, d.join(path, "topology")),
            vf_groups=[
                VirtualFunctionGroup.from_dict(g, d.join(d.join(path, "vfGroups"), i))
                for i, g in enumerate(d.array(data, "vfGroups", path))
            ],
            conditions=[
                Condition.from_dict(c, d.join(d.join(path, "conditions"), i))
                for i, c in enumerate(d.array(data, "conditions", path))
            ],
            nvlink=None if nvlink is None else NVLinkInfo.from_dict(nvlink, d.join(path, "nvlink")),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type}
        if self.labels:
            out["labels"] = sorted_map(self.labels)
        if self.id:
            out["id"] = self.id
        out["minor"] = self.minor
        if self.module_id is not None:
            out["moduleID"] = self.module_id
        out["health"] = self.health
        if self.resources:
            out["resources"] = sorted_map({k: str(v) for k, v in self.resources.items()})
        if self.topology is not None:
            out["topology"] = self.topology.to_dict()
        if self.vf_groups:
            out["vfGroups"] = [g.to_dict() for g in self.vf_groups]
        if self.conditions:
            out["conditions"] = [c.to_dict() for c in self.conditions]
        if self.nvlink is not None:
            out["nvlink"] = self.nvlink.to_dict()
        return out


@dataclass
class DeviceStatusEntry:
    """Per-device load and health detail (topoalloc extra, in status)."""

    type: str
    minor: int
    health: bool = True
    reason: str = ""
    message: str = ""
    last_xid: int | None = None
    utilization: int | None = None  # percent of compute busy
    memory_used: Quantity | None = None

    FIELDS = ("type", "minor", "health", "reason", "message", "lastXid", "utilization", "memoryUsed")

    @classmethod
    def from_dict(cls, value: Any, path: str) -> DeviceStatusEntry:
        data = d.struct(value, path, cls.FIELDS)
        mem = data.get("memoryUsed")
        return cls(
            type=d.string(data, "type", path, required=True),
            minor=d.integer(data, "minor", path, required=True, minimum=0),
            health=d.boolean(data, "health", path, default=True),
            reason=d.string(data, "reason", path),
            message=d.string(data, "message", path),
            last_xid=d.integer(data, "lastXid", path, default=None, minimum=0),
            utilization=d.integer(data, "utilization", path, default=None, minimum=0, maximum=100),
            memory_used=None if mem is None else Quantity.parse(mem, d.join(path, "memoryUsed")),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "minor": self.minor, "health": self.health}
        if self.reason:
            out["reason"] = self.reason
        if self.message:
            out["message"] = self.message
        if self.last_xid is not None:
            out["lastXid"] = self.last_xid
        if self.utilization is not None:
            out["utilization"] = self.utilization
        if self.memory_used is not None:
            out["memoryUsed"] = str(self.memory_used)
        return out


@dataclass(frozen=True)
class DeviceSummary:
    """Counts shown by `kubectl get devices` (status.summary, a topoalloc extra)."""

    gpus: int = 0
    rdma: int = 0
    healthy: int = 0
    total: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"gpus": self.gpus, "rdma": self.rdma, "healthy": f"{self.healthy}/{self.total}"}


@dataclass
class Device:
    metadata: dict[str, Any]
    devices: list[DeviceInfo] = field(default_factory=list)
    status_devices: list[DeviceStatusEntry] = field(default_factory=list)
    status_update_time: str = ""
    # Koordinator's status.allocations: unused by schedulers, kept verbatim.
    status_allocations: list[Any] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))

    @property
    def labels(self) -> dict[str, str]:
        return self.metadata.get("labels") or {}

    @property
    def annotations(self) -> dict[str, str]:
        return self.metadata.get("annotations") or {}

    def of_type(self, dtype: str) -> Iterator[DeviceInfo]:
        return (dev for dev in self.devices if dev.type == dtype)

    def summary(self) -> DeviceSummary:
        return DeviceSummary(
            gpus=sum(1 for dev in self.devices if dev.type == "gpu"),
            rdma=sum(1 for dev in self.devices if dev.type == "rdma"),
            healthy=sum(1 for dev in self.devices if dev.health),
            total=len(self.devices),
        )

    @classmethod
    def from_dict(cls, value: Any, path: str = "") -> Device:
        data = d.struct(value, path, ("apiVersion", "kind", "metadata", "spec", "status"))
        api = d.string(data, "apiVersion", path)
        if api and api != API_VERSION:
            raise CodecError(d.join(path, "apiVersion"), f"expected {API_VERSION}", api)
        kind = d.string(data, "kind", path)
        if kind and kind != KIND:
            raise CodecError(d.join(path, "kind"), f"expected {KIND}", kind)
        meta = d.obj(data.get("metadata") or {}, d.join(path, "metadata"))
        for sub in ("labels", "annotations"):
            d.str_map(meta, sub, d.join(path, "metadata"))
        spath = d.join(path, "spec")
        spec = d.struct(data.get("spec") or {}, spath, ("devices",))
        devices = [
            DeviceInfo.from_dict(v, d.join(d.join(spath, "devices"), i))
            for i, v in enumerate(d.array(spec, "devices", spath))
        ]
        seen: set[tuple[str, int]] = set()
        for i, dev in enumerate(devices):
            if (dev.type, dev.minor) in seen:
                raise CodecError(
                    d.join(d.join(d.join(spath, "devices"), i), "minor"),
                    f"duplicate minor for type {dev.type}",
                    dev.minor,
                )
            seen.add((dev.type, dev.minor))
        stpath = d.join(path, "status")
        status = d.struct(
            data.get("status") or {}, stpath, ("allocations", "devices", "updateTime", "summary")
        )
        return cls(
            metadata=meta,
            devices=devices,
            status_devices=[
                DeviceStatusEntry.from_dict(v, d.join(d.join(stpath, "devices"), i))
                for i, v in enumerate(d.array(status, "devices", stpath))
            ],
            status_update_time=d.string(status, "updateTime", stpath),
            status_allocations=d.array(status, "allocations", stpath),
        )

    def to_dict(self, *, with_summary: bool = False) -> dict[str, Any]:
        """The object as the API server stores it. `with_summary` adds status.summary (what the agent
        publishes); a decoded summary is derived data and is not kept."""
        out: dict[str, Any] = {"apiVersion": API_VERSION, "kind": KIND, "metadata": self.metadata}
        out["spec"] = {"devices": [dev.to_dict() for dev in self.devices]} if self.devices else {}
        status: dict[str, Any] = {}
        if with_summary:
            status["summary"] = self.summary().to_dict()
        if self.status_allocations:
            status["allocations"] = self.status_allocations
        if self.status_devices:
            status["devices"] = [s.to_dict() for s in self.status_devices]
        if self.status_update_time:
            status["updateTime"] = self.status_update_time
        if status:
            out["status"] = status
        return out

    # Convenience accessors for the Device labels of the contract.
    @property
    def gpu_model(self) -> str:
        return self.labels.get(keys.GPU_MODEL, "")

    @property
    def gpu_vendor(self) -> str:
        return self.labels.get(keys.GPU_VENDOR, "")

    @property
    def honors_gpu_partitions(self) -> bool:
        return self.labels.get(keys.GPU_PARTITION_POLICY) == "Honor"

    @property
    def secondary_device_well_planned(self) -> bool:
        return self.labels.get(keys.SECONDARY_DEVICE_WELL_PLANNED) == "true"
