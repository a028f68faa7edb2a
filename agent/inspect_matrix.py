"""`topoalloc inspect`: a Device CR printed as the connectivity matrix `nvidia-smi topo -m` prints.

The relation of two devices, tightest first:
  NV#   the two GPUs share an NVLink domain (# = the links between them, or into the NVSwitch fabric)
  PIX   at most one PCIe switch between them (or two functions of one card)
  PXB   several PCIe switches, without crossing the host bridge
  PHB   through the PCIe host bridge (same root complex)
  NODE  through the interconnect between host bridges of one NUMA node
  SYS   through the link between NUMA nodes (also when either NUMA node is unknown)
It works from the CR alone, so it also reads Devices written by koordlet (no pciePath: a shared
pcieSwitchID then counts as PIX).
"""

from __future__ import annotations

from typing import Any

from agent.pci import parse_bdf
from apis.device import Device, DeviceInfo, DeviceTopology

LEGEND = """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks"""


def _switches(topo: DeviceTopology) -> list[str]:
    ports = topo.pcie_path[1:]
    return [ports[i] for i in range(0, len(ports) - 1, 2)]


def pcie_relation(a: DeviceTopology | None, b: DeviceTopology | None) -> str:
    if a is None or b is None:
        return "SYS"
    ba, bb = parse_bdf(a.bus_id), parse_bdf(b.bus_id)
    if ba is not None and bb is not None and ba.slot == bb.slot:
        return "PIX"
    if a.pcie_path and b.pcie_path:
        sa, sb = _switches(a), _switches(b)
        common = 0
        while common < min(len(sa), len(sb)) and sa[common] == sb[common]:
            common += 1
        if common:
            crossed = (len(sa) - common) + (len(sb) - common) + 1
            return "PIX" if crossed == 1 else "PXB"
    elif a.pcie_switch_id and a.pcie_switch_id == b.pcie_switch_id:
        return "PIX"
    if a.pcie_id and a.pcie_id == b.pcie_id:
        return "PHB"
    if a.node_id >= 0 and a.node_id == b.node_id:
        return "NODE"
    return "SYS"


def relation(a: DeviceInfo, b: DeviceInfo) -> str:
    if a is b:
        return " X "
    if a.nvlink is not None and b.nvlink is not None and a.nvlink.domain == b.nvlink.domain:
        links = next((p.links for p in a.nvlink.peers if p.minor == b.minor), 0)
        if links:
            return f"NV{links}"
    return pcie_relation(a.topology, b.topology)


def render(device: Device) -> str:
    gpus = sorted(device.of_type("gpu"), key=lambda d: d.minor)
    nics = sorted(device.of_type("rdma"), key=lambda d: d.minor)
    rows = [(f"GPU{d.minor}", d) for d in gpus] + [(f"NIC{i}", d) for i, d in enumerate(nics)]
    if not rows:
        return f"{device.name}: no GPUs or RDMA devices\n"
    width = max(6, *(len(name) + 2 for name, _ in rows))
    header = (
        " " * width + "".join(name.ljust(width) for name, _ in rows) + "NUMA Affinity".ljust(15) + "Socket"
    )
    lines = [header]
    for name, dev in rows:
        cells = "".join(
            relation(dev, other).strip().ljust(width) if other is not dev else "X".ljust(width)
            for _, other in rows
        )
        topo = dev.topology
        numa = "N/A" if topo is None or topo.node_id < 0 else str(topo.node_id)
        socket = "N/A" if topo is None or topo.socket_id < 0 else str(topo.socket_id)
        lines.append(name.ljust(width) + cells + numa.ljust(15) + socket)
    lines.append(LEGEND)
    if nics:
        lines.append("\nNIC Legend:\n")
        for i, dev in enumerate(nics):
            health = "" if dev.health else "  (unhealthy)"
            name = dev.labels.get("ibdev") or dev.labels.get("netdev") or dev.id
            lines.append(f"  NIC{i}: {name} ({dev.id}){health}")
    return "\n".join(lines) + "\n"


def matrix_data(device: Device) -> dict[str, Any]:
    """The matrix `render` prints, as data: the devices (name, minor, id, NUMA node, socket, health)
    and each pair's relation by name."""
    gpus = sorted(device.of_type("gpu"), key=lambda d: d.minor)
    nics = sorted(device.of_type("rdma"), key=lambda d: d.minor)
    rows = [(f"GPU{d.minor}", d) for d in gpus] + [(f"NIC{i}", d) for i, d in enumerate(nics)]
    devices = []
    for name, dev in rows:
        topo = dev.topology
        devices.append(
            {
                "name": name,
                "type": dev.type,
                "minor": dev.minor,
                "id": dev.id,
                "numa": None if topo is None or topo.node_id < 0 else topo.node_id,
                "socket": None if topo is None or topo.socket_id < 0 else topo.socket_id,
                "healthy": dev.health,
            }
        )
    matrix = {
        name: {other_name: relation(dev, other).strip() for other_name, other in rows if other is not dev}
        for name, dev in rows
    }
    return {"node": device.name, "devices": devices, "matrix": matrix}
