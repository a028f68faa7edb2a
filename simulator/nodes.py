"""Where simulated nodes come from: the hw-fixtures (real machines' Device CRs, replicated), the
openb GPU node list, or any node CSV in the openb format.

`--nodes` takes `hw-fixtures` (every fixture, `replicas` nodes each),
`hw-fixtures:dgx-h100=4,l40s-8x-pcie=8` (chosen fixtures and counts), `openb` (the FGD paper's
1,213 nodes) or a path to a node CSV.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from simulator.objects import node_object, openb_node_objects
from simulator.openb import TraceError, load_nodes

FIXTURES_DIR = Path(__file__).resolve().parents[1] / "hw-fixtures"
DEVICE_FILE = "expected-device.yaml"

NodeObjects = tuple[dict[str, Any], dict[str, Any] | None]


@dataclass(frozen=True)
class NodeSize:
    """What a fixture machine offers the kubelet: allocatable CPU (milli-cores), memory (MiB) and
    pods. Operator settings, not recorded hardware facts: CPU counts follow the fixture's CPU lists
    where it has them; the rest are stated assumptions."""

    cpu_milli: int
    memory_mib: int
    pods: int = 250


FIXTURE_SIZES: dict[str, NodeSize] = {
    # 224 CPUs (2x Xeon 8480C, the fixture's CPU lists); DGX H100 ships 2 TB of memory.
    "dgx-h100": NodeSize(224_000, 2015 * 1024),
    # 80 CPUs (2x Xeon E5-2698 v4, the fixture's CPU lists); DGX-1 ships 512 GB of memory.
    "dgx1-v100": NodeSize(80_000, 512 * 1000**3 // 2**20),
    # 180 CPUs (the fixture's CPU lists); 1 TiB of memory assumed.
    "l40s-8x-pcie": NodeSize(180_000, 1007 * 1024),
    # CPU lists not published: 64 CPUs and 512 GiB assumed for a 4-GPU PCIe server.
    "a100-pcie-4x-no-rdma": NodeSize(64_000, 503 * 1024),
    # 208 CPUs (2x Xeon 8470, the fixture's CPU affinity lists); 1 TiB of memory assumed.
    "a100-pcie-4x-nvlink-pairs": NodeSize(208_000, 1007 * 1024),
    # A cloud VM with 4 GPUs: 64 vCPUs and 512 GiB assumed.
    "l20-4x-vm-numa-unknown": NodeSize(64_000, 503 * 1024),
    # A 3-GPU workstation: 64 CPUs and 256 GiB assumed.
    "rtx-a6000-nvlink-bridge": NodeSize(64_000, 251 * 1024),
    # 256 CPUs (2x EPYC 7713, the fixture's CPU lists); 512 GiB assumed.
    "cpu-only": NodeSize(256_000, 503 * 1024),
}
DEFAULT_SIZE = NodeSize(64_000, 503 * 1024)


def fixture_names() -> list[str]:
    if not FIXTURES_DIR.is_dir():
        raise TraceError(f"no hw-fixtures folder at {FIXTURES_DIR}")
    return sorted(p.parent.name for p in FIXTURES_DIR.glob(f"*/{DEVICE_FILE}"))


@functools.cache
def _fixture_device(name: str) -> dict[str, Any]:
    path = FIXTURES_DIR / name / DEVICE_FILE
    if not path.is_file():
        known = ", ".join(fixture_names())
        raise TraceError(f"unknown hw-fixture {name!r}; known: {known}")
    return yaml.safe_load(path.read_text())


def fixture_objects(fixture: str, node_name: str) -> NodeObjects:
    """The Node and Device of one replica of a fixture machine, renamed to ``node_name`` (device ids
    made unique per node). The Node carries the Device's labels, as Koordinator's slo-controller
    copies them."""
    device = copy.deepcopy(_fixture_device(fixture))
    meta = device.setdefault("metadata", {})
    meta["name"] = node_name
    devices = (device.get("spec") or {}).get("devices") or []
    for dev in devices:
        if dev.get("id"):
            dev["id"] = f"{dev['id']}-{node_name}"
    device.pop("status", None)
    size = FIXTURE_SIZES.get(fixture, DEFAULT_SIZE)
    node = node_object(node_name, size.cpu_milli, size.memory_mib, size.pods, dict(meta.get("labels") or {}))
    return node, device if devices else None


def fixture_cluster(counts: Mapping[str, int]) -> list[NodeObjects]:
    out = []
    for fixture, count in counts.items():
        out.extend(fixture_objects(fixture, f"{fixture}-{i:02d}") for i in range(count))
    return out


def parse_counts(text: str) -> dict[str, int]:
    """`dgx-h100=4,l40s-8x-pcie=8` -> {fixture: count}."""
    counts: dict[str, int] = {}
    for part in text.split(","):
        name, sep, count = part.strip().partition("=")
        if not name:
            continue
        try:
            counts[name] = int(count) if sep else 1
        except ValueError:
            raise TraceError(f"bad node count in {part!r}: use name=COUNT") from None
        if counts[name] < 0:
            raise TraceError(f"negative node count in {part!r}")
    return counts


def nodes_from_spec(spec: str, replicas: int = 4) -> list[NodeObjects]:
    """Node and Device objects for a `--nodes` value (see the module docstring)."""
    if spec == "hw-fixtures":
        return fixture_cluster(dict.fromkeys(fixture_names(), replicas))
    if spec.startswith("hw-fixtures:"):
        return fixture_cluster(parse_counts(spec.removeprefix("hw-fixtures:")))
    if spec == "openb":
        return [openb_node_objects(n) for n in load_nodes()]
    path = Path(spec)
    if not path.is_file():
        raise TraceError(f"--nodes {spec!r}: expected hw-fixtures[:NAME=COUNT,...], openb or a node CSV")
    return [openb_node_objects(n) for n in load_nodes(path)]
