"""Turn a discovery snapshot into the Device CR and the Node's labels and extended resources.

Pure: snapshot + config + node identity in, `apis.device.Device` (and plain dicts) out. Load values
are rounded (10% utilisation, 1 GiB memory by default) so that noise does not rewrite the object.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent.config import AgentConfig
from agent.discovery.device_health import Verdict
from agent.discovery.discoverer import Snapshot
from agent.discovery.node_topology import GpuNode, NicNode
from agent.discovery.sysfs import PciLocation
from agent.publish.partition_table import partitions_for
from apis import keys, resources
from apis.device import (
    API_VERSION,
    KIND,
    Condition,
    Device,
    DeviceInfo,
    DeviceStatusEntry,
    DeviceTopology,
    NVLinkInfo,
    NVLinkPeer,
    VirtualFunction,
    VirtualFunctionGroup,
)
from apis.quantity import Format, Quantity
from apis.timestamps import format_time

HEALTHY_CONDITION = "Healthy"
# Extended resources the agent owns on the Node (nvidia.com/gpu belongs to the device plugin).
NODE_GPU_RESOURCES = (
    resources.GPU_CORE,
    resources.GPU_MEMORY,
    resources.GPU_MEMORY_RATIO,
    resources.GPU,
)
NODE_RESOURCES = (*NODE_GPU_RESOURCES, resources.RDMA)
NODE_LABELS = (keys.GPU_VENDOR, keys.GPU_MODEL, keys.GPU_DRIVER_VERSION, keys.GPU_PARTITION_POLICY)


def gpu_model(name: str) -> str:
    """koordlet's model label: "NVIDIA H100 80GB HBM3" -> "H100-80GB-HBM3"."""
    model = name.removeprefix("NVIDIA ").strip()
    return "-".join(model.split())


def _label_value(text: str) -> str:
    """A valid label value: [A-Za-z0-9._-], at most 63 characters, alphanumeric at both ends."""
    cleaned = "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in text)[:63]
    return cleaned.strip("._-")


def _topology(loc: PciLocation | None, numa: int, socket: int, bus_id: str) -> DeviceTopology:
    return DeviceTopology(
        socket_id=socket,
        node_id=numa,
        pcie_id=loc.root_bus if loc else "",
        bus_id=bus_id,
        pcie_switch_id=loc.switch if loc else "",
        pcie_path=list(loc.bridges) if loc else [],
    )


def _condition(verdict: Verdict) -> Condition:
    return Condition(
        type=HEALTHY_CONDITION,
        status="True" if verdict.healthy else "False",
        reason=verdict.reason,
        message=verdict.message,
        last_transition_time=format_time(verdict.since),
    )


def _gpu_info(gpu: GpuNode, verdict: Verdict) -> DeviceInfo:
    facts = gpu.facts
    nvlink = None
    if gpu.nvlink_domain:
        nvlink = NVLinkInfo(
            domain=gpu.nvlink_domain,
            peers=[NVLinkPeer(m, n) for m, n in gpu.peers.items()],
            nvswitch=gpu.nvswitch,
        )
    return DeviceInfo(
        type=resources.DeviceType.GPU.value,
        minor=facts.minor,
        id=facts.uuid,
        health=verdict.healthy,
        resources={
            resources.GPU_CORE: Quantity.of(100),
            resources.GPU_MEMORY: Quantity.of(facts.memory_total, Format.BINARY_SI),
            resources.GPU_MEMORY_RATIO: Quantity.of(100),
        },
        topology=_topology(gpu.location, gpu.numa, gpu.socket, facts.bus_id),
        conditions=[_condition(verdict)],
        nvlink=nvlink,
    )


def _nic_labels(nic: NicNode) -> dict[str, str]:
    rdma = nic.rdma
    kind = rdma.name.rsplit("_", 1)[0] if "_" in rdma.name else rdma.name.rstrip("0123456789")
    labels = {"type": _label_value(kind), "ibdev": _label_value(rdma.name)}
    ports = [p for p in rdma.ports if p.link_layer]
    if ports:
        labels["linkLayer"] = _label_value(ports[0].link_layer)
    speeds = [p.rate_gbps for p in rdma.ports if p.rate_gbps]
    if speeds:
        labels["speedGbps"] = str(max(speeds))
    if rdma.netdevs:
        labels["netdev"] = _label_value(rdma.netdevs[0])
    if rdma.uverbs:
        labels["uverbs"] = _label_value(rdma.uverbs[0])
    return labels


def _nic_info(nic: NicNode, verdict: Verdict, vf_labels: dict[str, str]) -> DeviceInfo:
    loc = nic.location
    groups = []
    if nic.rdma.vfs:
        groups.append(
            VirtualFunctionGroup(
                labels=dict(vf_labels), vfs=[VirtualFunction(-1, vf) for vf in sorted(nic.rdma.vfs)]
            )
        )
    return DeviceInfo(
        type=resources.DeviceType.RDMA.value,
        minor=nic.minor,
        id=loc.bdf,
        labels=_nic_labels(nic),
        health=verdict.healthy,
        resources={resources.RDMA: Quantity.of(100)},
        topology=_topology(loc, nic.numa, nic.socket, loc.bdf),
        vf_groups=groups,
        conditions=[_condition(verdict)],
    )


def _quantise(value: int | None, quantum: int) -> int | None:
    if value is None or quantum <= 1:
        return value
    return round(value / quantum) * quantum


@dataclass(frozen=True)
class NodeRef:
    name: str
    uid: str = ""  # the Node's UID, for the ownerReference; "" when unknown (--print without cluster)


def build_device(snap: Snapshot, node: NodeRef, config: AgentConfig) -> Device:
    topo = snap.topology
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    gpus = [g for g in topo.gpus if g.minor >= 0]
    if gpus:
        names = sorted({g.facts.name for g in gpus if g.facts.name})
        model = gpu_model(names[0]) if names else ""
        labels[keys.GPU_VENDOR] = "nvidia"
        if model:
            labels[keys.GPU_MODEL] = _label_value(model)
        if snap.driver_version:
            labels[keys.GPU_DRIVER_VERSION] = _label_value(snap.driver_version)
        table, policy = partitions_for(gpus, model, config)
        if table is not None and table.by_size:
            annotations[keys.GPU_PARTITIONS] = table.to_json()
        if policy:
            labels[keys.GPU_PARTITION_POLICY] = policy
    metadata: dict[str, Any] = {"name": node.name}
    if labels:
        metadata["labels"] = labels
    if annotations:
        metadata["annotations"] = annotations
    if node.uid:
        metadata["ownerReferences"] = [
            # No blockOwnerDeletion: that would need update rights on nodes/finalizers.
            {"apiVersion": "v1", "kind": "Node", "name": node.name, "uid": node.uid}
        ]
    devices: list[DeviceInfo] = []
    status: list[DeviceStatusEntry] = []
    for gpu in gpus:
        verdict = snap.verdicts[("gpu", gpu.minor)]
        devices.append(_gpu_info(gpu, verdict))
        load = snap.gpu_loads.get(gpu.minor)
        status.append(
            DeviceStatusEntry(
                type=resources.DeviceType.GPU.value,
                minor=gpu.minor,
                health=verdict.healthy,
                reason="" if verdict.healthy else verdict.reason,
                message="" if verdict.healthy else verdict.message,
                last_xid=verdict.last_xid,
                utilization=_quantise(load.utilization, config.utilization_quantum) if load else None,
                memory_used=(
                    Quantity.of(_quantise(load.memory_used, config.memory_quantum) or 0, Format.BINARY_SI)
                    if load is not None and load.memory_used is not None
                    else None
                ),
            )
        )
    for nic in topo.nics:
        verdict = snap.verdicts[("rdma", nic.minor)]
        devices.append(_nic_info(nic, verdict, config.vf_group_labels))
        status.append(
            DeviceStatusEntry(
                type=resources.DeviceType.RDMA.value,
                minor=nic.minor,
                health=verdict.healthy,
                reason="" if verdict.healthy else verdict.reason,
                message="" if verdict.healthy else verdict.message,
            )
        )
    return Device(metadata=metadata, devices=devices, status_devices=status)


def device_object(device: Device) -> dict[str, Any]:
    """The Device as the agent writes it (with the printer-column summary)."""
    out = device.to_dict(with_summary=True)
    out["apiVersion"], out["kind"] = API_VERSION, KIND
    return out


def node_resources(device: Device) -> dict[str, str | None]:
    """Node capacity/allocatable for the agent's extended resources (None removes one)."""
    healthy_gpus = [d for d in device.devices if d.type == resources.DeviceType.GPU and d.health]
    healthy_nics = [d for d in device.devices if d.type == resources.DeviceType.RDMA and d.health]
    out: dict[str, str | None] = dict.fromkeys(NODE_RESOURCES)
    if healthy_gpus:
        total = {name: Quantity(0) for name in NODE_GPU_RESOURCES}
        for dev in healthy_gpus:
            for name in (resources.GPU_CORE, resources.GPU_MEMORY, resources.GPU_MEMORY_RATIO):
                total[name] = total[name] + dev.resources[name]
        total[resources.GPU] = total[resources.GPU_CORE]
        memory = total[resources.GPU_MEMORY]
        total[resources.GPU_MEMORY] = Quantity(memory.nanos, Format.BINARY_SI)
        out.update({name: str(q) for name, q in total.items()})
    if healthy_nics:
        out[resources.RDMA] = str(Quantity.of(100 * len(healthy_nics)))
    return out


def node_labels(device: Device) -> dict[str, str | None]:
    """The Device labels copied to the Node (None removes one the agent set before)."""
    return {key: device.labels.get(key) for key in NODE_LABELS}
