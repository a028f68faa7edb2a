"""NVIDIA's go-gpuallocator test machines and cases, and its best-effort policy's set score.

github.com/NVIDIA/go-gpuallocator tests its best-effort policy (`gpuallocator/besteffort_policy.go`)
on three machine models (`gpuallocator/common_test.go`): a DGX-1 with P100 (every NVLink pair one
link), a DGX-1 with V100 (pairs with two links, one or none) and a 4x Quadro RTX 8000 board with
two NVLink bridges. Each model gives, per GPU pair, its NVLinks and its PCIe relation. Its 52
cases (`gpuallocator/besteffort_test.go` before "required" devices were added) are sequences of
allocations on one node (`AllocTest`: each request and the set it must get) and four choices
among a given set of free GPUs (`PolicyAllocTest`).

Here each model is a Device CR the allocator reads like any other (`model_device`): PCIe switch,
root complex and NUMA node per GPU laid out so that every pair's relation is the model's. These
are NVIDIA's models of the machines, not recordings, so they live with the tests rather than in
hw-fixtures/ (the DGX-1 V100 fixture there agrees with the Volta model pair by pair).

`set_score` is the policy's rule for one set: the sum over its pairs of 100 per NVLink plus the
PCIe relation's points (same board 60, one switch 50, several switches 40, one host bridge 30,
one CPU 20, across CPUs 10).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from typing import Any

# PCIe relations as go-gpuallocator names them, with its points.
SINGLE_SWITCH, HOST_BRIDGE, SAME_CPU, CROSS_CPU = "SingleSwitch", "HostBridge", "SameCPU", "CrossCPU"
PCIE_POINTS = {SINGLE_SWITCH: 50, HOST_BRIDGE: 30, SAME_CPU: 20, CROSS_CPU: 10}
NVLINK_POINTS = 100


@dataclass(frozen=True)
class Model:
    name: str
    gpu_model: str  # the Device's gpu-model label (sets the per-link rate)
    gpus: int
    nvlinks: dict[frozenset[int], int]
    # Where each GPU sits, chosen so that every pair's relation is the model's (checked by `relation`).
    socket: tuple[int, ...]
    root: tuple[int, ...]  # root complex per GPU
    switch: tuple[int, ...]  # PCIe switch per GPU (-1: straight under its root port)

    def relation(self, a: int, b: int) -> str:
        if self.socket[a] != self.socket[b]:
            return CROSS_CPU
        if self.switch[a] >= 0 and self.switch[a] == self.switch[b]:
            return SINGLE_SWITCH
        if self.root[a] == self.root[b]:
            return HOST_BRIDGE
        return SAME_CPU


def _pairs(text: str) -> list[tuple[int, int]]:
    """ "0-1 2-3" -> [(0, 1), (2, 3)]"""
    return [(int(a), int(b)) for a, b in (p.split("-") for p in text.split())]


def _links(single: str, double: str = "") -> dict[frozenset[int], int]:
    out = {frozenset(p): 1 for p in _pairs(single)}
    out.update({frozenset(p): 2 for p in _pairs(double)})
    return out


# NewDGX1PascalNode: a cube-mesh with one link on each of its 16 edges; per socket two switches,
# GPUs 0/2 and 1/3 (4/6 and 5/7) behind one, the other pairs of a socket across the host bridge.
DGX1_PASCAL = Model(
    "DGX-1 P100 (go-gpuallocator NewDGX1PascalNode)",
    "Tesla-P100-SXM2-16GB",
    8,
    _links("0-1 0-2 0-3 0-4 1-2 1-3 1-5 2-3 2-6 3-7 4-5 4-6 4-7 5-6 5-7 6-7"),
    socket=(0, 0, 0, 0, 1, 1, 1, 1),
    root=(0, 0, 0, 0, 1, 1, 1, 1),
    switch=(0, 1, 0, 1, 2, 3, 2, 3),
)

# NewDGX1VoltaNode: the hybrid cube-mesh (two links on 0-3, 0-4, 1-2, 1-5, 2-3, 4-7, 5-6, 6-7);
# GPUs 0/1, 2/3, 4/5, 6/7 behind one switch each.
DGX1_VOLTA = Model(
    "DGX-1 V100 (go-gpuallocator NewDGX1VoltaNode)",
    "Tesla-V100-SXM2-32GB",
    8,
    _links(single="0-1 0-2 1-3 2-6 3-7 4-5 4-6 5-7", double="0-3 0-4 1-2 1-5 2-3 4-7 5-6 6-7"),
    socket=(0, 0, 0, 0, 1, 1, 1, 1),
    root=(0, 0, 0, 0, 1, 1, 1, 1),
    switch=(0, 0, 1, 1, 2, 2, 3, 3),
)

# New4xRTX8000Node: bridges join 0-3 and 1-2 (two links each); 0/1 and 2/3 on one CPU each, each
# GPU under its own root port.
RTX8000_4X = Model(
    "4x Quadro RTX 8000 (go-gpuallocator New4xRTX8000Node)",
    "Quadro-RTX-8000",
    4,
    _links(single="", double="0-3 1-2"),
    socket=(0, 0, 1, 1),
    root=(0, 1, 2, 3),
    switch=(-1, -1, -1, -1),
)

MODELS = (DGX1_PASCAL, DGX1_VOLTA, RTX8000_4X)

# The models' published relations (common_test.go), to hold the layouts above to them; pairs not
# listed cross the CPUs.
PUBLISHED_RELATIONS: dict[str, dict[str, str]] = {
    DGX1_PASCAL.name: {
        SINGLE_SWITCH: "0-2 1-3 4-6 5-7",
        HOST_BRIDGE: "0-1 0-3 1-2 2-3 4-5 4-7 5-6 6-7",
    },
    DGX1_VOLTA.name: {
        SINGLE_SWITCH: "0-1 2-3 4-5 6-7",
        HOST_BRIDGE: "0-2 0-3 1-2 1-3 4-6 4-7 5-6 5-7",
    },
    RTX8000_4X.name: {SAME_CPU: "0-1 2-3"},
}


def published_relation(model: Model, a: int, b: int) -> str:
    pair = (min(a, b), max(a, b))
    for relation, pairs in PUBLISHED_RELATIONS[model.name].items():
        if pair in _pairs(pairs):
            return relation
    return CROSS_CPU


def pair_score(model: Model, a: int, b: int) -> int:
    return NVLINK_POINTS * model.nvlinks.get(frozenset((a, b)), 0) + PCIE_POINTS[model.relation(a, b)]


def set_score(model: Model, gpus: tuple[int, ...] | list[int]) -> int:
    """The best-effort policy's score of one set: the sum of its pairs' scores."""
    return sum(pair_score(model, a, b) for a, b in combinations(sorted(gpus), 2))


@dataclass(frozen=True)
class Sequence:
    """An AllocTest list: requests on one node in turn, each with the set NVIDIA's policy gives
    (empty: the request cannot be met)."""

    model: Model
    steps: tuple[tuple[int, tuple[int, ...]], ...]


@dataclass(frozen=True)
class Choice:
    """A PolicyAllocTest: `size` GPUs out of the free `available`, and the policy's answer."""

    model: Model
    available: tuple[int, ...]
    size: int
    expected: tuple[int, ...]
    description: str


def _singles(n: int) -> tuple[tuple[int, tuple[int, ...]], ...]:
    return (*((1, (i,)) for i in range(n)), (1, ()))


SEQUENCES = (
    Sequence(RTX8000_4X, _singles(4)),
    Sequence(RTX8000_4X, ((2, (0, 3)), (2, (1, 2)), (1, ()))),
    Sequence(RTX8000_4X, ((4, (0, 1, 2, 3)), (1, ()))),
    Sequence(DGX1_PASCAL, _singles(8)),
    Sequence(DGX1_PASCAL, ((2, (0, 2)), (2, (1, 3)), (2, (4, 6)), (2, (5, 7)), (1, ()))),
    Sequence(DGX1_PASCAL, ((4, (0, 1, 2, 3)), (4, (4, 5, 6, 7)), (1, ()))),
    Sequence(DGX1_PASCAL, ((8, tuple(range(8))), (1, ()))),
    Sequence(DGX1_VOLTA, _singles(8)),
    Sequence(DGX1_VOLTA, ((2, (0, 3)), (2, (1, 2)), (2, (4, 7)), (2, (5, 6)), (1, ()))),
    Sequence(DGX1_VOLTA, ((4, (0, 1, 2, 3)), (4, (4, 5, 6, 7)), (1, ()))),
    Sequence(DGX1_VOLTA, ((8, tuple(range(8))), (1, ()))),
)

CHOICES = (
    Choice(DGX1_VOLTA, (0, 2, 4, 5), 2, (4, 5), "Single NVLINK, prefer same switch"),
    Choice(DGX1_VOLTA, (0, 4, 5, 6), 2, (5, 6), "Single NVLINK, prefer same socket"),
    Choice(DGX1_VOLTA, (0, 3, 1), 2, (0, 3), "Prefer dual NVLINK same socket"),
    Choice(DGX1_VOLTA, (0, 1, 4), 2, (0, 4), "Prefer dual NVLINK cross socket"),
)

CASES = sum(len(s.steps) for s in SEQUENCES) + len(CHOICES)  # 52


def model_device(model: Model, name: str = "") -> dict[str, Any]:
    """The model as a Device CR (whole GPUs of 32 GiB; bus and switch ids made up)."""
    devices = []
    for g in range(model.gpus):
        bus = 0x10 + g
        peers = [
            {"minor": o, "links": n}
            for o in range(model.gpus)
            if (n := model.nvlinks.get(frozenset((g, o)), 0))
        ]
        topology: dict[str, Any] = {
            "socketID": model.socket[g],
            "nodeID": model.socket[g],
            "pcieID": f"pci0000:{model.root[g]:02x}",
            "busID": f"0000:{bus:02x}:00.0",
        }
        if model.switch[g] >= 0:
            topology["pcieSwitchID"] = f"0000:{0x80 + model.switch[g]:02x}:00.0"
        dev: dict[str, Any] = {
            "type": "gpu",
            "id": f"GPU-model-{g}",
            "minor": g,
            "health": True,
            "resources": {
                "koordinator.sh/gpu-core": "100",
                "koordinator.sh/gpu-memory": "32Gi",
                "koordinator.sh/gpu-memory-ratio": "100",
            },
            "topology": topology,
        }
        if peers:
            dev["nvlink"] = {"domain": f"nvlink{_domains(model)[g]}", "peers": peers}
        devices.append(dev)
    return {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Device",
        "metadata": {
            "name": name or model.gpu_model.lower(),
            "labels": {"node.koordinator.sh/gpu-model": model.gpu_model},
        },
        "spec": {"devices": devices},
    }


def _domains(model: Model) -> list[int]:
    """Each GPU's NVLink domain: the lowest GPU it reaches over NVLink."""
    out = list(range(model.gpus))
    changed = True
    while changed:
        changed = False
        for pair in model.nvlinks:
            a, b = sorted(pair)
            low = min(out[a], out[b])
            if out[a] != low or out[b] != low:
                out[a] = out[b] = low
                changed = True
    return out
