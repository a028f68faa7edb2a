"""The Koordinator-default baseline: its view of the Device CR, its node scoring (spread), its
device choice on that view, and a replay that keeps the real cluster and its shadow in step."""

from __future__ import annotations

import json
import random

from allocator.core.devices.allocate import Allocation
from allocator.core.node.inventory import build_inventory
from allocator.core.scoring.device import DeviceScoring
from apis.annotations import parse_device_allocated
from simulator.cluster import RequestFactory, SimCluster, SimRequest
from simulator.engine import POLICIES, run_replay
from simulator.koordinator_policy import KoordinatorPolicy, balanced_score, fit_score, koordinator_view
from simulator.nodes import _fixture_device, fixture_cluster, fixture_objects
from simulator.objects import node_object, pod_object
from simulator.runner import workload_setup

FACTORY = RequestFactory()


def req(name: str, requests: dict[str, str], annotations: dict[str, str] | None = None) -> SimRequest:
    return FACTORY.request(pod_object(name, requests, annotations=annotations))


def gpus(n: int, cpu: str = "8") -> dict[str, str]:
    return {"cpu": cpu, "memory": "32Gi", "nvidia.com/gpu": str(n)}


def policy(cluster: SimCluster, seed: int = 1) -> KoordinatorPolicy:
    p = KoordinatorPolicy(list(range(cluster.size)), random.Random(seed))
    p.attach(cluster)
    return p


def test_the_view_drops_only_topoallocs_extras() -> None:
    device = _fixture_device("dgx-h100")
    view = koordinator_view(device)
    inv, koord = build_inventory(device), build_inventory(view)
    assert inv.nvlink_domains and not koord.nvlink_domains
    assert all(s.pcie_scope == s.pcie_root for s in koord.slots("gpu"))
    assert any(s.pcie_scope != s.pcie_root for s in inv.slots("gpu"))
    assert koord.partitions == inv.partitions  # the gpu-partitions table is Koordinator's own field
    assert device["spec"]["devices"][0]["nvlink"]  # the original is untouched


def test_node_choice_spreads() -> None:
    """LeastAllocated everywhere: the second pod goes to the emptier node; topoalloc packs."""
    objects = fixture_cluster({"l40s-8x-pcie": 2})
    first, second = req("a", gpus(1)), req("b", gpus(1))
    picks = {}
    for name in ("koordinator", "topoalloc"):
        cluster = SimCluster(objects)
        chosen = POLICIES[name](workload_setup(cluster.size, 1), None)  # type: ignore[arg-type]
        chosen.attach(cluster)
        nodes = []
        for r in (first, second):
            (placed,) = cluster.place((r,), chosen).placed
            nodes.append(placed.node)
        picks[name] = nodes
    assert picks["koordinator"][0] != picks["koordinator"][1]
    assert picks["topoalloc"][0] == picks["topoalloc"][1]


def test_kube_scores() -> None:
    cluster = SimCluster([fixture_objects("l40s-8x-pcie", "n")])
    state = cluster.states[0]
    r = req("p", {"cpu": "90", "memory": "100Gi"})
    # cpu 90 of 180 cores left half, memory 100Gi of 1007Gi: (50 + 90) / 2
    assert fit_score(state, r) == (50 + (1007 - 100) * 100 // 1007) // 2
    assert balanced_score(state, r) == int((1 - abs(0.5 - 100 / 1007) / 2) * 100)


def _bridged_board() -> tuple[dict, dict]:
    """One socket, four GPUs on their own root buses, NVLink bridges joining 0-1 and 2-3; no
    partition table."""
    devices = [
        {
            "type": "gpu",
            "id": f"GPU-{m}",
            "minor": m,
            "health": True,
            "resources": {"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory-ratio": "100"},
            "topology": {"socketID": 0, "nodeID": 0, "pcieID": f"pci000{m}", "busID": f"0000:1{m}:00.0"},
            "nvlink": {"domain": f"nv{m // 2}", "peers": [{"minor": m ^ 1, "links": 4}]},
        }
        for m in range(4)
    ]
    device = {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Device",
        "metadata": {"name": "b"},
        "spec": {"devices": devices},
    }
    return node_object("b", 64_000, 256 * 1024, 110), device


def test_device_choice_ignores_nvlink() -> None:
    """GPU 1 taken, a 2-GPU pod: Koordinator's walk takes the first two free GPUs of the NUMA
    scope (0, 2: no NVLink between them); topoalloc's NVLink-first walk takes the free pair 2-3."""
    cluster = SimCluster([_bridged_board()])
    one = req("one", gpus(1))
    cluster.assign(0, one, _take(cluster, one, 1))
    two = req("two", gpus(2))
    p = policy(cluster)
    allocation = p.select(cluster, two, cluster.feasible(two)).allocation
    assert allocation is not None and allocation.minors("gpu") == [0, 2]
    assert cluster.allocate(0, two, scoring=DeviceScoring()).minors("gpu") == [2, 3]


def _take(cluster: SimCluster, r: SimRequest, minor: int) -> Allocation:
    return Allocation(
        parse_device_allocated(
            json.dumps({"gpu": [{"minor": minor, "resources": {"koordinator.sh/gpu-core": "100"}}]})
        )
    )


def test_joint_nic_on_koordinators_view() -> None:
    """A joint GPU+NIC pod on a DGX: the NIC chosen on the root-bus view sits beside the GPU."""
    cluster = SimCluster([fixture_objects("dgx-h100", "d")])
    p = policy(cluster)
    pod = req(
        "j",
        {**gpus(1), "koordinator.sh/rdma": "1"},
        {
            "scheduling.koordinator.sh/device-allocate-hint": '{"rdma":{"vfSelector":{}}}',
            "scheduling.koordinator.sh/device-joint-allocate": '{"deviceTypes":["gpu","rdma"],"requiredScope":"SamePCIe"}',
        },
    )
    allocation = p.select(cluster, pod, cluster.feasible(pod)).allocation
    assert allocation is not None
    inv = cluster.states[0].inventory
    assert inv is not None
    g = inv.slot("gpu", allocation.minors("gpu")[0])
    n = inv.slot("rdma", allocation.minors("rdma")[0])
    assert g is not None and n is not None and g.pcie_root == n.pcie_root


def test_replay_keeps_the_shadow_in_step() -> None:
    """Gangs that fail are taken back on the real cluster; the shadow must follow (it is rebuilt
    from the real node's pods whenever that node changed)."""
    cluster = SimCluster(fixture_cluster({"dgx-h100": 1, "l40s-8x-pcie": 1}))
    p = KoordinatorPolicy(list(range(cluster.size)), random.Random(3))
    stream = [req(f"p{i}", gpus(n)) for i, n in enumerate([2, 4, 1, 8, 2, 1, 4])]
    result = run_replay(cluster, stream, "koordinator", p, seed=3)
    assert result.pods == 7 and p.fallbacks == 0
    for i in range(cluster.size):
        real, shadow = cluster.states[i], p.shadow(cluster, i)
        assert shadow.free == real.free and set(shadow.pods) == set(real.pods)
