"""Topology-quality metrics on hand-built placements: the level of a GPU set, the best a node type
allows, GPU-to-NIC pairing, and the per-run counts read back from the simulated cluster."""

from __future__ import annotations

import itertools
import json
import math
import random
from typing import Any

import pytest

from allocator.core.devices.allocate import Allocation
from allocator.core.node.inventory import build_inventory
from apis.annotations import parse_device_allocated
from simulator.cluster import Placed, RequestFactory, SimCluster
from simulator.nodes import _fixture_device, fixture_objects
from simulator.objects import node_object, openb_node_objects, pod_object
from simulator.openb import OpenbNode
from simulator.policies import RandomPolicy
from simulator.quality import (
    CROSS,
    NO_TOPOLOGY,
    NOT_PLACED,
    NUMA,
    NVLINK,
    PCIE,
    SOCKET,
    QualityStats,
    best_level,
    binned_share,
    equal_count_edges,
    gpu_set_level,
    nic_level,
    placement_quality,
    record,
    same_pcie_possible,
)


def fixture(name: str) -> Any:
    return build_inventory(_fixture_device(name))


def gpu(minor: int, numa: int, socket: int, root: str, switch: str = "", domain: str = "") -> dict[str, Any]:
    topology = {"socketID": socket, "nodeID": numa, "pcieID": root, "busID": f"0000:{minor + 16:02x}:00.0"}
    if switch:
        topology["pcieSwitchID"] = switch
    out = {
        "type": "gpu",
        "id": f"GPU-{minor}",
        "minor": minor,
        "health": True,
        "resources": {"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory-ratio": "100"},
        "topology": topology,
    }
    if domain:
        out["nvlink"] = {"domain": domain}
    return out


def device(devices: list[dict[str, Any]], name: str = "hand") -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Device",
        "metadata": {"name": name},
        "spec": {"devices": devices},
    }


# 8 GPUs in two NVLink domains of four, one per socket; two GPUs per PCIe switch.
SPLIT_BOARD = device(
    [
        gpu(m, numa=m // 4, socket=m // 4, root=f"pci{m // 2}", switch=f"sw{m // 2}", domain=f"nv{m // 4}")
        for m in range(8)
    ]
)
# 4 GPUs without NVLink on one socket with two NUMA nodes (sub-NUMA clustering), a switch per pair.
SNC_BOARD = device([gpu(m, numa=m // 2, socket=0, root=f"pci{m}", switch=f"sw{m // 2}") for m in range(4)])


def test_a_split_8_gpu_pod_counts_as_split() -> None:
    inv = build_inventory(SPLIT_BOARD)
    assert gpu_set_level(inv, range(8)) == CROSS  # two NVLink domains, two sockets
    assert best_level(inv, 8) == CROSS  # nothing better exists for 8 on this board
    assert gpu_set_level(inv, [0, 1, 2, 3]) == NVLINK
    assert gpu_set_level(inv, [2, 3, 4, 5]) == CROSS
    assert best_level(inv, 4) == NVLINK
    placed = placement_quality(inv, [2, 3, 4, 5], [], whole=True)
    assert (placed.level, placed.best) == (CROSS, NVLINK)


def test_8_gpu_pods_on_real_boards() -> None:
    dgx, l40s = fixture("dgx-h100"), fixture("l40s-8x-pcie")
    assert gpu_set_level(dgx, range(8)) == NVLINK  # one NVSwitch domain
    assert gpu_set_level(l40s, range(8)) == CROSS  # PCIe only, across both sockets
    assert gpu_set_level(l40s, [0, 1, 2, 3]) == NUMA
    assert best_level(l40s, 4) == NUMA and best_level(l40s, 5) == CROSS


def test_levels_below_nvlink() -> None:
    inv = build_inventory(SNC_BOARD)
    assert gpu_set_level(inv, [0, 1]) == PCIE  # same switch, different root buses
    assert gpu_set_level(inv, [1, 2]) == SOCKET  # same socket, two NUMA nodes
    assert best_level(inv, 2) == PCIE and best_level(inv, 3) == SOCKET


def test_nvlink_pairs_and_unknown_numa() -> None:
    a100 = fixture("a100-pcie-4x-nvlink-pairs")
    assert gpu_set_level(a100, [0, 1]) == NVLINK
    assert gpu_set_level(a100, [1, 2]) == CROSS
    assert best_level(a100, 2) == NVLINK and best_level(a100, 4) == CROSS
    l20 = fixture("l20-4x-vm-numa-unknown")  # NUMA and socket unknown: nothing can be claimed
    assert gpu_set_level(l20, [0, 1]) == CROSS and best_level(l20, 2) == CROSS


def test_nodes_without_topology_have_no_level() -> None:
    devices = [gpu(m, 0, 0, "pci0") for m in range(2)]
    for d in devices:
        del d["topology"]
    inv = build_inventory(device(devices))
    assert gpu_set_level(inv, [0, 1]) is None and best_level(inv, 2) is None
    with pytest.raises(ValueError, match="not all on the node"):
        gpu_set_level(inv, [0, 5])


def test_nic_pairing_on_a_dgx() -> None:
    dgx = fixture("dgx-h100")
    # GPU0 and NIC0 share PCIe switch 0000:16:00.0; NIC3 is on GPU1's switch (NUMA 0); NIC6 on socket 1
    assert nic_level(dgx, 0, [0]) == PCIE
    assert nic_level(dgx, 0, [3]) == NUMA
    assert nic_level(dgx, 0, [6]) == CROSS  # a NIC across the socket is not SamePCIe
    assert nic_level(dgx, 0, [6, 0]) == PCIE  # the closest NIC of the pod counts
    assert same_pcie_possible(dgx, range(8))
    # the pod's level is its worst GPU's: GPU4 gets no NIC near it
    assert placement_quality(dgx, [0, 4], [0], whole=True).nic == CROSS
    assert placement_quality(dgx, [0, 4], [0, 6], whole=True).nic == PCIE


def test_nic_pairing_where_the_hardware_cannot() -> None:
    l40s = fixture("l40s-8x-pcie")  # one NIC, NUMA unknown, behind no GPU's switch
    assert not same_pcie_possible(l40s, [0])
    placed = placement_quality(l40s, [0, 1], [0], whole=True)
    assert placed.nic == CROSS and not placed.nic_possible


def _allocation(entries: dict[str, list[int]]) -> Any:
    body = {
        dtype: [
            {
                "minor": m,
                "resources": {"koordinator.sh/gpu-core": "100"}
                if dtype == "gpu"
                else {"koordinator.sh/rdma": "1"},
            }
            for m in minors
        ]
        for dtype, minors in entries.items()
    }
    return parse_device_allocated(json.dumps(body))


def test_record_reads_placements_back_from_the_cluster() -> None:
    """Hand-placed pods on a DGX and an L40S node: the counts the replay would report."""
    cluster = SimCluster([fixture_objects("dgx-h100", "dgx"), fixture_objects("l40s-8x-pcie", "l40s")])
    factory = RequestFactory()
    joint = '{"deviceTypes":["gpu","rdma"]}'

    def req(name: str, gpus: int, rdma: bool = False) -> Any:
        requests = {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": str(gpus)}
        annotations = {}
        if rdma:
            requests["koordinator.sh/rdma"] = "1"
            annotations["scheduling.koordinator.sh/device-joint-allocate"] = joint
        return factory.request(pod_object(name, requests, annotations=annotations))

    stats = QualityStats()
    placements = [
        (req("split", 8), "l40s", {"gpu": list(range(8))}),
        (req("paired", 2, rdma=True), "dgx", {"gpu": [0, 1], "rdma": [0, 3]}),
        (req("far-nic", 2, rdma=True), "dgx", {"gpu": [2, 3], "rdma": [6]}),
    ]
    for r, node, entries in placements:
        i = cluster.index[node]
        allocation = Allocation(_allocation(entries))
        cluster.assign(i, r, allocation)
        record(stats, r, Placed(r, i, allocation, cluster.states[i]), arrived_pct=55.0)
    record(stats, req("never-placed", 8), None, arrived_pct=60.0)

    assert stats.arrived == {8: 2, 2: 2}
    assert stats.multi == {8: [1, 0, 0, 0, 0], 2: [0, 0, 0, 0, 2]}
    assert stats.at_best_pct() == 100.0  # the L40S allows nothing better than across sockets
    assert stats.level_pct(NVLINK, 8) == 0.0 and stats.arrived_level_pct(CROSS, 8) == 50.0
    assert stats.nic == [1, 0, 0, 1, 0] and stats.nic_pct(PCIE) == 50.0
    assert stats.nic_possible_pct() == 50.0
    assert stats.load_multi[5] == 3 and stats.load_nvlink[5] == 2  # the (50, 60] load bin
    assert stats.load_arrived[5] == 4 and stats.load_curve(nvlink=True, of_arrived=True)[5] == 50.0
    assert sorted(stats.arrivals) == [(55.0, CROSS), (55.0, NVLINK), (55.0, NVLINK), (60.0, NOT_PLACED)]
    assert math.isnan(stats.at_best_pct(4))


def test_shares_and_cpu_pods_are_not_counted() -> None:
    cluster = SimCluster([(node_object("n", 8000, 1024, 10), None)])
    factory = RequestFactory()
    stats = QualityStats()
    pod = factory.request(pod_object("cpu", {"cpu": "1"}))
    (placed,) = cluster.place((pod,), RandomPolicy([0], random.Random(1))).placed
    assert not placed.allocation.devices.by_type
    record(stats, pod, placed, arrived_pct=1.0)
    assert stats == QualityStats()


def test_merge_adds_counts() -> None:
    a, b = QualityStats(), QualityStats()
    a.multi[2] = [0, 0, 1, 0, 1]
    a.multi_at_best[2] = 1
    b.multi[2] = [0, 0, 0, 0, 2]
    b.multi_at_best[2] = 2
    b.arrived[2] = 3
    a.merge(b)
    assert a.multi[2] == [0, 0, 1, 0, 3] and a.at_best_pct(2) == 75.0 and a.arrived == {2: 3}


def test_pods_on_nodes_without_topology_are_left_out() -> None:
    """openb nodes carry no topology: a 2-GPU pod there has no level and no share of one."""
    cluster = SimCluster([openb_node_objects(OpenbNode("o", 32_000, 65_536, 4, "T4"))])
    pod = RequestFactory().request(pod_object("two", {"cpu": "1", "nvidia.com/gpu": "2"}))
    allocation = cluster.allocate(0, pod)
    cluster.assign(0, pod, allocation)
    stats = QualityStats()
    record(stats, pod, Placed(pod, 0, allocation, cluster.states[0]), arrived_pct=10.0)
    assert stats.arrived == {2: 1} and stats.multi_no_topology == {2: 1} and stats.multi == {}
    assert math.isnan(stats.arrived_level_pct(CROSS, 2)) and math.isnan(stats.level_pct(CROSS, 2))


def test_load_bins_hold_about_equally_many_pods_and_never_a_handful() -> None:
    """The topology-vs-load plot's bins: about equally many arrived pods each, at least 15, so a
    point is never a percentage of two pods (the 10% bins of ~70 pods jumped between 0 and 100)."""
    rng = random.Random(7)
    loads = [rng.uniform(0, 130) for _ in range(70)]
    edges = equal_count_edges(loads)
    assert len(edges) == 5 and edges[0] == 0.0 and edges[-1] >= max(loads)
    counts = [sum(a < x <= b for x in loads) for a, b in itertools.pairwise(edges)]
    assert sum(counts) == 70 and min(counts) >= 15 and max(counts) - min(counts) <= 1
    assert equal_count_edges(loads[:20]) == [0.0, max(100.0, max(loads[:20]))]  # one bin, not 2
    assert equal_count_edges([]) == []


def test_binned_share_counts_each_pod_once_and_says_of_how_many() -> None:
    arrivals = [(10.0, NVLINK), (20.0, PCIE), (30.0, NOT_PLACED), (70.0, NVLINK), (80.0, NO_TOPOLOGY)]
    edges = [0.0, 50.0, 100.0]
    assert binned_share(arrivals, edges, of_arrived=False) == ([50.0, 100.0], [2, 1])
    shares, counts = binned_share(arrivals, edges, of_arrived=True)
    assert counts == [3, 1] and shares[0] == pytest.approx(100 / 3)
