"""Materialise a hardware fixture from its reviewed description (`machine.yaml`).

Each fixture folder holds `machine.yaml` (every fact once, next to its source), and the files the
agent reads, generated from it: `nvml.json` and a `sys/` tree laid out like the kernel's, with real
directories for the PCI hierarchy and relative symlinks for bus/pci/devices, class/*, driver,
physfn and virtfnN. Tests check that the committed tree is exactly what this composer produces, so
the tree can never drift from the description its README cites.

    python -m agent.fixture_compose hw-fixtures/dgx-h100
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from agent.nvml_replay import FORMAT_VERSION
from agent.pci import nvml_bus_id, parse_bdf
from agent.record import copy_sysfs

# NVML common-ancestor levels (nvmlGpuTopologyLevel_t).
TOPOLOGY_INTERNAL, TOPOLOGY_SINGLE, TOPOLOGY_MULTIPLE = 0, 10, 20
TOPOLOGY_HOSTBRIDGE, TOPOLOGY_NODE, TOPOLOGY_SYSTEM = 30, 40, 50


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")


def _link(path: Path, target: Path) -> None:
    """A relative symlink at `path` pointing to `target` (both absolute inside the tree)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rel = os.path.relpath(target, path.parent)
    if path.is_symlink() or path.exists():
        path.unlink()
    os.symlink(rel, path)


class _Tree:
    def __init__(self, sys_root: Path) -> None:
        self.root = sys_root
        self.dirs: dict[str, Path] = {}  # bdf -> device directory

    def device_dir(self, entry: dict[str, Any]) -> Path:
        return self.root / "devices" / Path(*entry["path"]) / entry["bdf"]

    def add_function(self, entry: dict[str, Any], *, parent_dir: Path | None = None) -> Path:
        bdf = entry["bdf"]
        d = (parent_dir / bdf) if parent_dir is not None else self.device_dir(entry)
        d.mkdir(parents=True, exist_ok=True)
        self.dirs[bdf] = d
        _write(d / "numa_node", str(entry.get("numa", -1)))
        if entry.get("driver"):
            # The driver's directory lists each device bound to it, as the kernel does on bind.
            drv = self.root / "bus/pci/drivers" / entry["driver"]
            _link(drv / bdf, d)
            _link(d / "driver", drv)
        _link(self.root / "bus/pci/devices" / bdf, d)
        return d

    def add_rdma(self, d: Path, rdma: dict[str, Any]) -> None:
        ib = d / "infiniband" / rdma["ibdev"]
        ib.mkdir(parents=True, exist_ok=True)
        _link(ib / "device", d)
        if rdma.get("node_guid"):
            _write(ib / "node_guid", rdma["node_guid"])
        for port, attrs in (rdma.get("ports") or {}).items():
            for name, value in attrs.items():
                _write(ib / "ports" / str(port) / name, str(value))
        _link(self.root / "class/infiniband" / rdma["ibdev"], ib)
        if rdma.get("uverbs"):
            uv = d / "infiniband_verbs" / rdma["uverbs"]
            _write(uv / "ibdev", rdma["ibdev"])
            minor = int(rdma["uverbs"].removeprefix("uverbs"))
            _write(uv / "dev", f"231:{192 + minor}")
            _link(self.root / "class/infiniband_verbs" / rdma["uverbs"], uv)
        for netdev in rdma.get("netdevs") or ([rdma["netdev"]] if rdma.get("netdev") else []):
            nd = d / "net" / netdev
            _link(nd / "device", d)  # every netdev of a PCI function links back to it
            _link(self.root / "class/net" / netdev, nd)


def compose_sys(spec: dict[str, Any], sys_root: Path) -> None:
    tree = _Tree(sys_root)
    nodes = spec.get("numa") or []
    if nodes:
        # The kernel's node lists; a node whose CPU list is not published gets no nodeN/cpulist.
        _write(sys_root / "devices/system/node/online", _kernel_list(sorted(int(n["node"]) for n in nodes)))
    for node in nodes:
        if node.get("cpulist") is not None:
            _write(sys_root / f"devices/system/node/node{node['node']}/cpulist", node["cpulist"])
        if node.get("socket") is not None and node.get("cpulist"):
            first = int(node["cpulist"].split(",")[0].split("-")[0])
            _write(
                sys_root / f"devices/system/cpu/cpu{first}/topology/physical_package_id", str(node["socket"])
            )
    for entry in spec.get("pci") or []:
        d = tree.add_function(entry)
        if entry.get("rdma"):
            tree.add_rdma(d, entry["rdma"])
        sriov = entry.get("sriov")
        if sriov:
            _write(d / "sriov_totalvfs", str(sriov["total"]))
            vfs = sriov.get("vfs") or []
            _write(d / "sriov_numvfs", str(len(vfs)))
            for n, vf in enumerate(vfs):
                vf_entry = {"bdf": vf["bdf"], "numa": entry.get("numa", -1), "driver": sriov.get("vf_driver")}
                vd = tree.add_function(vf_entry, parent_dir=d.parent)
                _link(vd / "physfn", d)
                _link(d / f"virtfn{n}", vd)
                if vf.get("ibdev"):
                    tree.add_rdma(
                        vd, {"ibdev": vf["ibdev"], "uverbs": vf.get("uverbs"), "ports": vf.get("ports")}
                    )


def _kernel_list(numbers: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5", the kernel's list format."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _level(a: dict[str, Any], b: dict[str, Any]) -> int:
    """NVML's common-ancestor level of two PCI functions from their bridge chains."""
    if a["path"][0] != b["path"][0]:
        both_known = a.get("numa", -1) >= 0 and b.get("numa", -1) >= 0
        return TOPOLOGY_NODE if both_known and a["numa"] == b["numa"] else TOPOLOGY_SYSTEM
    pa, pb = a["path"][1:], b["path"][1:]
    common = 0
    while common < min(len(pa), len(pb)) and pa[common] == pb[common]:
        common += 1
    if common <= 1:  # only the root bus (or root port) in common
        return TOPOLOGY_HOSTBRIDGE
    switches = (len(pa) - common) // 2 + (len(pb) - common) // 2 + 1
    return TOPOLOGY_SINGLE if switches <= 1 else TOPOLOGY_MULTIPLE


def compose_nvml(spec: dict[str, Any]) -> dict[str, Any]:
    nvml = spec.get("nvml") or {}
    out: dict[str, Any] = {"format": FORMAT_VERSION, "source": spec.get("machine", "")}
    for key in ("initError", "driverVersion", "cudaDriverVersion"):
        if nvml.get(key) is not None:
            out[key] = nvml[key]
    pci = {e["bdf"]: e for e in spec.get("pci") or []}
    devices = []
    gpus = nvml.get("gpus") or []
    for gpu in gpus:
        dev = {k: v for k, v in gpu.items() if k not in ("bus", "nvlink")}
        dev["pciBusId"] = nvml_bus_id(gpu["bus"])
        nvlink = gpu.get("nvlink")
        if nvlink:
            links = []
            for target in nvlink.get("to") or []:
                remote = target["remote"]
                remote_id = nvml_bus_id(remote) if parse_bdf(remote) else remote
                for _ in range(int(target["count"])):
                    links.append(
                        {
                            "state": target.get("state", 1),
                            "remotePciBusId": remote_id,
                            "remoteType": target["type"],
                        }
                    )
            for _ in range(int(nvlink.get("inactive", 0))):
                links.append({"state": 0})
            dev["nvlink"] = {"version": nvlink["version"], "links": links}
        here = pci.get(gpu["bus"])
        if here is not None:
            dev["topology"] = {
                nvml_bus_id(o["bus"]): _level(here, pci[o["bus"]])
                for o in gpus
                if o is not gpu and o["bus"] in pci
            }
        devices.append(dev)
    out["devices"] = devices
    return out


def compose(folder: str | Path, out: str | Path | None = None) -> Path:
    """Write nvml.json and sys/ for the fixture in `folder` (into `out`, default the folder)."""
    folder = Path(folder)
    target = Path(out) if out is not None else folder
    with open(folder / "machine.yaml", encoding="utf-8") as fh:
        spec = yaml.safe_load(fh)
    target.mkdir(parents=True, exist_ok=True)
    if (target / "sys").exists():
        shutil.rmtree(target / "sys")
    nvml = compose_nvml(spec)
    with tempfile.TemporaryDirectory() as tmp:
        # The description makes a kernel-like tree; the fixture keeps exactly what the agent reads.
        compose_sys(spec, Path(tmp) / "sys")
        copy_sysfs(nvml, Path(tmp) / "sys", target / "sys")
    with open(target / "nvml.json", "w", encoding="utf-8") as fh:
        json.dump(nvml, fh, indent=1, sort_keys=False)
        fh.write("\n")
    return target


if __name__ == "__main__":  # pragma: no cover
    for arg in sys.argv[1:]:
        print(compose(arg))
