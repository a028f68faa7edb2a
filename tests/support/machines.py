"""Device CRs of the two machine types the allocator tests and benchmarks run on.

`machine_device(kind, name)` reads the recorded `hw-fixtures/<dir>/expected-device.yaml` (see
FIXTURE_DIRS) when it exists, and otherwise builds an equivalent CR here:

* `dgx-h100`: NVIDIA DGX H100 as published in NVIDIA's DGX H100 user guide and its `nvidia-smi
  topo -m`: 8x H100 SXM5 80GB (81559 MiB each) on one NVSwitch fabric, two sockets / NUMA nodes
  (GPUs 0-3 on NUMA 0 at buses 0x18, 0x2a, 0x3a, 0x5d; GPUs 4-7 on NUMA 1 at 0x9a, 0xab, 0xba,
  0xdb), eight single-port ConnectX-7 NICs, each under the same PCIe switch as its GPU. The switch
  and NIC bus numbers and the 8 SR-IOV VFs per NIC are illustrative (not from a recording).
* `l40s`: an 8x L40S PCIe server (46068 MiB each) without NVLink: two sockets / NUMA nodes, four
  PCIe switches with two GPUs each, and two ConnectX-7 NICs (on the first switch of each socket).
  Bus numbers are illustrative.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import yaml

from apis import keys

REPO = Path(__file__).resolve().parents[2]

H100_GPU_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
H100_MEMORY = "81559Mi"
L40S_GPU_BUSES = (0x1B, 0x1C, 0x3B, 0x3C, 0x9B, 0x9C, 0xBB, 0xBC)
L40S_MEMORY = "46068Mi"


def _bdf(bus: int, dev: int = 0, fn: int = 0) -> str:
    return f"0000:{bus:02x}:{dev:02x}.{fn}"


def _vfs(bus: int, count: int = 8) -> list[dict[str, Any]]:
    # Functions 2.. on device 0, then device 1 (ConnectX VFs follow the PF this way).
    out = []
    for i in range(count):
        dev, fn = divmod(i + 2, 8)
        out.append({"minor": -1, "busID": _bdf(bus, dev, fn)})
    return out


def _gpu(
    minor: int, bus: int, numa: int, root: int, switch: int, memory: str, nvlink: dict[str, Any] | None
) -> dict[str, Any]:
    dev = {
        "type": "gpu",
        "id": f"GPU-{bus:02x}{minor:02d}0000-0000-4000-8000-00000000{minor:04d}",
        "minor": minor,
        "health": True,
        "resources": {
            "koordinator.sh/gpu-core": "100",
            "koordinator.sh/gpu-memory": memory,
            "koordinator.sh/gpu-memory-ratio": "100",
        },
        "topology": {
            "socketID": numa,
            "nodeID": numa,
            "pcieID": f"pci0000:{root:02x}",
            "busID": _bdf(bus),
            "pcieSwitchID": _bdf(switch),
        },
    }
    if nvlink is not None:
        dev["nvlink"] = nvlink
    return dev


def _nic(minor: int, bus: int, numa: int, root: int, switch: int) -> dict[str, Any]:
    return {
        "type": "rdma",
        "labels": {"type": "mlx5"},
        "id": _bdf(bus),
        "minor": minor,
        "health": True,
        "resources": {"koordinator.sh/rdma": "100"},
        "topology": {
            "socketID": numa,
            "nodeID": numa,
            "pcieID": f"pci0000:{root:02x}",
            "busID": _bdf(bus),
            "pcieSwitchID": _bdf(switch),
        },
        "vfGroups": [{"vfs": _vfs(bus)}],
    }


def _device(name: str, model: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Device",
        "metadata": {
            "name": name,
            "labels": {
                keys.GPU_VENDOR: "nvidia",
                keys.GPU_MODEL: model,
                keys.GPU_DRIVER_VERSION: "550.90.07",
            },
        },
        "spec": {"devices": devices},
    }


def dgx_h100_device(name: str = "dgx-h100") -> dict[str, Any]:
    gpus, nics = [], []
    for i, bus in enumerate(H100_GPU_BUSES):
        numa = 0 if i < 4 else 1
        root, switch = bus - 3, bus - 2
        peers = [{"minor": j, "links": 18} for j in range(8) if j != i]
        nvlink = {"domain": "nvswitch-0", "peers": peers, "nvswitch": True}
        gpus.append(_gpu(i, bus, numa, root, switch, H100_MEMORY, nvlink))
        nics.append(_nic(i, bus + 1, numa, root, switch))
    return _device(name, "H100-80GB-HBM3", gpus + nics)


def l40s_device(name: str = "l40s") -> dict[str, Any]:
    gpus, nics = [], []
    for i, bus in enumerate(L40S_GPU_BUSES):
        numa = 0 if i < 4 else 1
        first = L40S_GPU_BUSES[i - i % 2]
        root, switch = first - 3, first - 2
        gpus.append(_gpu(i, bus, numa, root, switch, L40S_MEMORY, None))
        if i % 4 == 0:
            nics.append(_nic(len(nics), first + 2, numa, root, switch))
    return _device(name, "L40S", gpus + nics)


_BUILDERS = {"dgx-h100": dgx_h100_device, "l40s": l40s_device}
FIXTURE_DIRS = {
    "dgx-h100": "dgx-h100",
    "l40s": "l40s-8x-pcie",
    "dgx1-v100": "dgx1-v100",
}  # hw-fixtures/<dir> per kind


@functools.cache
def _recorded(kind: str) -> dict[str, Any] | None:
    path = REPO / "hw-fixtures" / FIXTURE_DIRS[kind] / "expected-device.yaml"
    if not path.is_file():
        return None
    return yaml.safe_load(path.read_text())


def machine_device(kind: str, name: str | None = None) -> dict[str, Any]:
    """The Device CR of `kind` ("dgx-h100", "l40s" or "dgx1-v100") renamed to `name`."""
    recorded = _recorded(kind)
    if recorded is None:
        return _BUILDERS[kind](name or kind)
    device = copy.deepcopy(recorded)
    device.setdefault("metadata", {})["name"] = name or kind
    return device


def uses_recorded_fixture(kind: str) -> bool:
    return _recorded(kind) is not None


def koordinator_example_device() -> dict[str, Any]:
    """The protocol document's section 2.4 example node (gpu-node-01)."""
    import json

    return json.loads((REPO / "tests" / "core" / "data" / "koord-example-device.json").read_text())
