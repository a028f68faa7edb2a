"""Reads the parts of sysfs the agent needs, under a root path (`/sys` on a node, a fixture's
`sys/` in tests). Only `realpath`/`readlink` are used to follow links, never absolute `/sys` paths,
so a recorded tree behaves exactly like the live one.

Reading never raises for a missing, unreadable or odd file: the value becomes "unknown" (NUMA -1,
an empty string) and a problem is noted, so the caller can publish what it knows and say why the
rest is missing.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from agent import host_paths
from agent.discovery.pci_address import ROOT_BUS, parse_bdf

NUMA_UNKNOWN = -1
_MAX_VFS = 65536  # the SR-IOV capability's 16-bit VF count bounds the probe
_CPULIST = re.compile(r"^\s*\d+(-\d+)?(,\d+(-\d+)?)*\s*$")


@dataclass(frozen=True)
class PciLocation:
    """Where a PCI function sits: its root bus and the bridges between the root port and it."""

    bdf: str
    root_bus: str  # "pci0000:15"; "" when the device is not under a PCI root (odd sysfs)
    bridges: tuple[str, ...]  # root port first, the device's parent last
    numa_node: int
    driver: str

    @property
    def switches(self) -> tuple[str, ...]:
        """Upstream ports of the PCIe switches above the device, outermost first.

        Below the root port a switch shows up as an upstream port followed by a downstream port,
        so every other bridge from the second one on is a switch's upstream port. A lone extra
        bridge without a downstream port is not a switch."""
        ports = self.bridges[1:]
        return tuple(ports[i] for i in range(0, len(ports) - 1, 2))

    @property
    def switch(self) -> str:
        """The outermost switch: devices under it talk without crossing the host bridge."""
        sw = self.switches
        return sw[0] if sw else ""


@dataclass(frozen=True)
class RdmaPort:
    number: int
    state: str  # "ACTIVE", "DOWN", ... (the name after "N: ")
    phys_state: str
    rate_gbps: int  # 0 when unknown
    rate: str  # the kernel's text, e.g. "400 Gb/sec (4X NDR)"
    link_layer: str  # "InfiniBand" | "Ethernet" | ""

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"


@dataclass(frozen=True)
class RdmaDevice:
    """An RDMA-capable physical function with its ibdevs, ports, netdevs, uverbs and VFs."""

    name: str  # the first ibdev of the PF, e.g. "mlx5_0"
    ibdevs: tuple[str, ...]
    location: PciLocation
    ports: tuple[RdmaPort, ...]
    netdevs: tuple[str, ...]
    uverbs: tuple[str, ...]  # "uverbs0", ...
    vfs: tuple[str, ...]  # VF BDFs in virtfn order
    sriov_total: int
    sriov_num: int
    node_guid: str


class Sysfs:
    def __init__(self, root: str | os.PathLike[str] = host_paths.SYSFS) -> None:
        self.root = Path(root)
        self._real_root = os.path.realpath(self.root) + os.sep
        self.problems: list[str] = []

    # -- primitives ---------------------------------------------------------------------
    def _note(self, message: str) -> None:
        if message not in self.problems:
            self.problems.append(message)

    def read(self, rel: str | Path) -> str | None:
        """A file's stripped text, or None when it is missing or unreadable."""
        path = self.root / rel
        try:
            with open(path, "rb") as fh:
                data = fh.read(65536)
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._note(f"{rel}: unreadable ({exc.strerror or exc})")
            return None
        try:
            return data.decode("utf-8").strip()
        except UnicodeDecodeError:
            self._note(f"{rel}: not text")
            return None

    def read_int(self, rel: str | Path, default: int, base: int = 10) -> int:
        text = self.read(rel)
        if text is None:
            return default
        try:
            return int(text, base)
        except ValueError:
            self._note(f"{rel}: unexpected content {text[:40]!r}")
            return default

    def listdir(self, rel: str | Path) -> list[str]:
        try:
            return sorted(os.listdir(self.root / rel))
        except FileNotFoundError:
            return []
        except OSError as exc:
            self._note(f"{rel}: cannot list ({exc.strerror or exc})")
            return []

    def resolve(self, rel: str | Path) -> Path | None:
        """The real path of a link under the root, relative to the root; None if it leads outside."""
        path = os.path.join(self.root, rel)
        if not os.path.lexists(path):
            return None
        real = os.path.realpath(path)
        if not real.startswith(self._real_root):
            self._note(f"{rel}: link leads outside the sysfs root")
            return None
        return Path(real[len(self._real_root) :])

    def exists(self, rel: str | Path) -> bool:
        return os.path.lexists(self.root / rel)

    def link_name(self, rel: str | Path) -> str:
        """Basename of a link's target (`driver` -> "mlx5_core"), "" when absent."""
        path = self.root / rel
        try:
            return os.path.basename(os.readlink(path))
        except OSError:
            return ""

    # -- PCI ----------------------------------------------------------------------------
    def pci_path(self, bdf: str) -> Path | None:
        """devices/pci0000:15/.../<bdf>, relative to the root."""
        real = self.resolve(Path("bus/pci/devices") / bdf)
        if real is None or real.name != bdf:
            return None
        return real

    def pci(self, bdf: str) -> PciLocation | None:
        real = self.pci_path(bdf)
        if real is None:
            self._note(f"PCI device {bdf}: not in bus/pci/devices")
            return None
        parts = real.parts
        root_bus, bridges = "", ()
        if len(parts) >= 3 and parts[0] == "devices" and ROOT_BUS.match(parts[1]):
            root_bus = parts[1]
            bridges = tuple(p for p in parts[2:-1] if parse_bdf(p) is not None)
        numa = self.read_int(real / "numa_node", NUMA_UNKNOWN)
        if numa < NUMA_UNKNOWN:
            self._note(f"PCI device {bdf}: numa_node {numa} is not a NUMA node")
            numa = NUMA_UNKNOWN
        return PciLocation(bdf, root_bus, bridges, numa, self.link_name(real / "driver"))

    # -- NUMA / sockets -------------------------------------------------------------------
    def numa_node_ids(self) -> list[int]:
        """The online NUMA nodes: the kernel's `node/online` list ("0-1"), else the nodeN entries
        (a tree without that file). A node whose CPU list is unknown still counts."""
        text = self.read("devices/system/node/online")
        if text is not None:
            ids = parse_list(text)
            if ids is not None:
                return ids
            self._note(f"devices/system/node/online: odd list {text[:40]!r}")
        names = self.listdir("devices/system/node")
        return sorted(int(n[4:]) for n in names if n.startswith("node") and n[4:].isdigit())

    def numa_nodes(self) -> dict[int, str]:
        """NUMA node -> cpulist ("0-55,112-167"); "" when not known."""
        out: dict[int, str] = {}
        for node in self.numa_node_ids():
            cpus = self.read(f"devices/system/node/node{node}/cpulist") or ""
            if cpus and not _CPULIST.match(cpus):
                self._note(f"NUMA node node{node}: odd cpulist {cpus[:40]!r}")
                cpus = ""
            out[node] = cpus
        return out

    def socket_of_cpu(self, cpu: int) -> int:
        return self.read_int(f"devices/system/cpu/cpu{cpu}/topology/physical_package_id", -1)

    def numa_sockets(self, nodes: dict[int, str] | None = None) -> dict[int, int]:
        """NUMA node -> CPU socket, from the node's first CPU."""
        out: dict[int, int] = {}
        for node, cpus in (self.numa_nodes() if nodes is None else nodes).items():
            first = first_cpu(cpus)
            out[node] = -1 if first is None else self.socket_of_cpu(first)
        return out

    # -- RDMA -----------------------------------------------------------------------------
    def _virtfns(self, pci_dir: Path) -> list[str]:
        """VF addresses in virtfn order. The kernel numbers the links virtfn0..numvfs-1 without
        gaps, so they are probed in turn rather than by listing the PF's directory (which would
        make a recording copy every attribute of the PF)."""
        vfs = []
        for n in range(_MAX_VFS):
            if not self.exists(pci_dir / f"virtfn{n}"):
                break
            target = self.resolve(pci_dir / f"virtfn{n}")
            if target is not None and parse_bdf(target.name) is not None:
                vfs.append(target.name)
        return vfs

    def uverbs_by_ibdev(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for name in self.listdir("class/infiniband_verbs"):
            if not name.startswith("uverbs"):
                continue
            ibdev = self.read(f"class/infiniband_verbs/{name}/ibdev")
            if ibdev:
                out.setdefault(ibdev, []).append(name)
        return out

    def uverbs_by_function(self) -> dict[str, list[str]]:
        """PCI function -> its `uverbsN` char devices. Each `class/infiniband_verbs/uverbsN` links to
        `<PCI function>/infiniband_verbs/uverbsN`, for VFs as for PFs."""
        out: dict[str, list[str]] = {}
        for name in self.listdir("class/infiniband_verbs"):
            target = self.resolve(f"class/infiniband_verbs/{name}")
            if name.startswith("uverbs") and target is not None and target.parent.name == "infiniband_verbs":
                out.setdefault(target.parent.parent.name, []).append(name)
        for verbs in out.values():
            verbs.sort(key=lambda n: int(n[6:]) if n[6:].isdigit() else 0)
        return out

    def rdma_port(self, ibdev: str, port: str) -> RdmaPort:
        base = f"class/infiniband/{ibdev}/ports/{port}"
        rate = self.read(f"{base}/rate") or ""
        match = re.match(r"^\s*(\d+)", rate)
        return RdmaPort(
            number=int(port) if port.isdigit() else 0,
            state=_after_colon(self.read(f"{base}/state")),
            phys_state=_after_colon(self.read(f"{base}/phys_state")),
            rate_gbps=int(match.group(1)) if match else 0,
            rate=rate,
            link_layer=self.read(f"{base}/link_layer") or "",
        )

    def rdma_devices(self) -> list[RdmaDevice]:
        """RDMA physical functions (VFs are listed under their PF), sorted by PF address."""
        uverbs = self.uverbs_by_ibdev()
        by_pf: dict[str, list[str]] = {}
        for ibdev in self.listdir("class/infiniband"):
            dev = self.resolve(f"class/infiniband/{ibdev}/device")
            if dev is None or parse_bdf(dev.name) is None:
                self._note(f"RDMA device {ibdev}: no PCI device link")
                continue
            if self.exists(dev / "physfn"):
                continue  # a VF's own ibdev; the VF is reported under its PF
            by_pf.setdefault(dev.name, []).append(ibdev)
        out = []
        for bdf in sorted(by_pf):
            location = self.pci(bdf)
            if location is None:
                continue
            ibdevs = tuple(sorted(by_pf[bdf], key=_natural))
            pci_dir = self.pci_path(bdf)
            assert pci_dir is not None  # pci() found it
            vfs = self._virtfns(pci_dir)
            ports = tuple(
                self.rdma_port(ibdevs[0], p) for p in self.listdir(f"class/infiniband/{ibdevs[0]}/ports")
            )
            out.append(
                RdmaDevice(
                    name=ibdevs[0],
                    ibdevs=ibdevs,
                    location=location,
                    ports=ports,
                    netdevs=tuple(self.listdir(pci_dir / "net")),
                    uverbs=tuple(sorted((u for ib in ibdevs for u in uverbs.get(ib, [])), key=_natural)),
                    vfs=tuple(vfs),
                    sriov_total=self.read_int(pci_dir / "sriov_totalvfs", 0),
                    sriov_num=self.read_int(pci_dir / "sriov_numvfs", 0),
                    node_guid=self.read(f"class/infiniband/{ibdevs[0]}/node_guid") or "",
                )
            )
        return out


def parse_list(text: str, limit: int = 1 << 16) -> list[int] | None:
    """The kernel's list format ("0-1,4") as numbers; None when it is not one (or absurdly long)."""
    text = text.strip()
    if not text:
        return []
    if not _CPULIST.match(text):
        return None
    out: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        first, last = int(low), int(high or low)
        if last < first or len(out) + last - first >= limit:
            return None
        out.extend(range(first, last + 1))
    return out


def first_cpu(cpulist: str) -> int | None:
    match = re.match(r"^\s*(\d+)", cpulist or "")
    return int(match.group(1)) if match else None


def _after_colon(text: str | None) -> str:
    """ "4: ACTIVE" -> "ACTIVE"; "" when unknown."""
    if not text:
        return ""
    return text.split(":", 1)[1].strip() if ":" in text else text.strip()


def _natural(name: str) -> tuple[str, int]:
    match = re.match(r"^(.*?)(\d+)$", name)
    return (match.group(1), int(match.group(2))) if match else (name, -1)
