"""The devices the node chooses for a pod without an allocation for it (agent/deviceplugin/
node_choice.py, gpu_choice.py), on the Devices the agent publishes for the recorded machines
(hw-fixtures/*/expected-device.yaml): NVLink sets kept, one NUMA node before two, GPUs and NICs
behind one PCIe switch, shares packed."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pytest

from agent.deviceplugin.expectation import ExpectationError
from agent.deviceplugin.inventory import Inventory, inventory_from_device
from agent.deviceplugin.node_choice import NodeUse, NoRoom, Offered, plan_pod
from agent.deviceplugin.node_request import pod_ask
from apis import keys
from apis.annotations import DeviceAllocation
from apis.device import Device
from tests.agent.support import golden

JOINT = {keys.DEVICE_JOINT_ALLOCATE: json.dumps({"deviceTypes": ["gpu", "rdma"]})}
SAME_PCIE = {
    keys.DEVICE_JOINT_ALLOCATE: json.dumps({"deviceTypes": ["gpu", "rdma"], "requiredScope": "SamePCIe"})
}
WITH_VF = {
    keys.DEVICE_ALLOCATE_HINT: json.dumps({"rdma": {"vfSelector": {"matchLabels": {"type": "general"}}}})
}


@cache
def inventory(fixture: str) -> Inventory:
    return inventory_from_device(Device.from_dict(golden(fixture)))


def pod(
    limits: dict[str, str], annotations: dict[str, str] | None = None, **more: dict[str, str]
) -> dict[str, Any]:
    containers = [{"name": "main", "resources": {"limits": limits}}]
    containers += [{"name": name, "resources": {"limits": lim}} for name, lim in more.items()]
    return {
        "metadata": {"name": "p", "namespace": "ns", "annotations": annotations or {}},
        "spec": {"containers": containers},
    }


def whole(*minors: int) -> NodeUse:
    """GPUs held whole by other pods."""
    return NodeUse(core=dict.fromkeys(minors, 100), ratio=dict.fromkeys(minors, 100))


def gpus(fixture: str, limits: dict[str, str], use: NodeUse | None = None, **kw: Any) -> list[int]:
    plan = plan_pod(pod_ask(pod(limits, **kw)), inventory(fixture), use or NodeUse(), {})
    return [e.minor for c in plan.gpu for e in c]


def test_dgx1_nvlink_sets_by_bandwidth() -> None:
    """DGX-1 V100: pairs with two NVLinks first, and the set that leaves the others their partner."""
    assert gpus("dgx1-v100", {"nvidia.com/gpu": "2"}) == [0, 3]
    assert gpus("dgx1-v100", {"nvidia.com/gpu": "2"}, whole(0, 3)) == [1, 2]  # next to the used pair
    assert gpus("dgx1-v100", {"nvidia.com/gpu": "3"}) == [0, 2, 3]  # the best triangle
    assert gpus("dgx1-v100", {"nvidia.com/gpu": "4"}) == [0, 1, 2, 3]  # a socket's quad
    assert gpus("dgx1-v100", {"nvidia.com/gpu": "4"}, whole(1)) == [4, 5, 6, 7]
    assert gpus("dgx1-v100", {"nvidia.com/gpu": "8"}) == list(range(8))


def test_a100_pairs_a_single_gpu_keeps_the_other_pair_whole() -> None:
    """Two NVLink bridged pairs (0-1, 2-3): a 2-GPU pod gets a pair; single GPUs fill one pair
    before breaking the other."""
    assert gpus("a100-pcie-4x-nvlink-pairs", {"nvidia.com/gpu": "2"}) == [0, 1]
    assert gpus("a100-pcie-4x-nvlink-pairs", {"nvidia.com/gpu": "2"}, whole(1)) == [2, 3]
    assert gpus("a100-pcie-4x-nvlink-pairs", {"nvidia.com/gpu": "1"}) == [0]
    assert gpus("a100-pcie-4x-nvlink-pairs", {"nvidia.com/gpu": "1"}, whole(0)) == [1]
    assert gpus("a100-pcie-4x-nvlink-pairs", {"nvidia.com/gpu": "1"}, whole(2)) == [3]


def test_a_single_gpu_leaves_the_bridged_pair_alone() -> None:
    """RTX A6000: GPUs 0-1 bridged by NVLink, GPU 2 alone, all on one NUMA node: a one-GPU pod
    takes GPU 2 (what a choice leaves free outweighs the lowest minor)."""
    assert gpus("rtx-a6000-nvlink-bridge", {"nvidia.com/gpu": "1"}) == [2]
    assert gpus("rtx-a6000-nvlink-bridge", {"nvidia.com/gpu": "2"}) == [0, 1]


def test_pcie_only_machine_keeps_a_set_on_one_numa_node() -> None:
    """L40S, no NVLink, one root port per GPU: a set stays on one NUMA node (one socket) when it
    can, beside the GPUs already in use."""
    assert gpus("l40s-8x-pcie", {"nvidia.com/gpu": "4"}) == [0, 1, 2, 3]
    assert gpus("l40s-8x-pcie", {"nvidia.com/gpu": "4"}, whole(1)) == [4, 5, 6, 7]
    assert gpus("l40s-8x-pcie", {"nvidia.com/gpu": "2"}, whole(0)) == [1, 2]
    assert gpus("l40s-8x-pcie", {"nvidia.com/gpu": "2"}, whole(0, 1, 4, 5)) == [2, 3]
    assert sorted(gpus("l40s-8x-pcie", {"nvidia.com/gpu": "5"})) == [0, 1, 2, 3, 4]  # fewest cross pairs


def test_shares_go_to_the_gpu_they_fit_best() -> None:
    half = NodeUse(core={5: 50}, ratio={5: 50})
    share = {"koordinator.sh/gpu-core": "30", "koordinator.sh/gpu-memory-ratio": "30"}
    assert gpus("l40s-8x-pcie", share, half) == [5]
    big = {"koordinator.sh/gpu-core": "60", "koordinator.sh/gpu-memory-ratio": "60"}
    assert gpus("l40s-8x-pcie", big, half) == [0]
    # memory decides too: GPU 5 has compute left but not memory
    tight = NodeUse(core={5: 50}, ratio={5: 90})
    assert gpus("l40s-8x-pcie", share, tight) == [0]
    plan = plan_pod(pod_ask(pod(share)), inventory("l40s-8x-pcie"), half, {})
    (entry,) = plan.gpu[0]
    assert (entry.minor, entry.id) == (5, inventory("l40s-8x-pcie").gpus[5].uuid)
    assert {k: str(v) for k, v in entry.resources.items()} == {
        "koordinator.sh/gpu-core": "30",
        "koordinator.sh/gpu-memory-ratio": "30",
        "koordinator.sh/gpu-memory": "14491739750",  # 30 % of 46068 MiB in bytes, as fillGPUTotalMem
    }


def test_share_by_memory_bytes_and_one_share_over_two_gpus() -> None:
    plan = plan_pod(
        pod_ask(pod({"koordinator.sh/gpu-core": "20", "koordinator.sh/gpu-memory": "9Gi"})),
        inventory("l40s-8x-pcie"),
        NodeUse(),
        {},
    )
    res = {k: str(v) for k, v in plan.gpu[0][0].resources.items()}
    assert res == {
        "koordinator.sh/gpu-core": "20",
        "koordinator.sh/gpu-memory": "9Gi",
        "koordinator.sh/gpu-memory-ratio": "20",
    }
    two = {
        "koordinator.sh/gpu-core": "100",
        "koordinator.sh/gpu-memory-ratio": "100",
        "koordinator.sh/gpu.shared": "2",
    }
    assert gpus("l40s-8x-pcie", two) == [0, 1]


def nics(plan: Any) -> list[tuple[int, str, list[str]]]:
    return [(e.minor, e.id, [vf.bus_id for vf in e.vfs]) for c in plan.rdma for e in c]


def test_dgx_h100_gpu_and_nic_behind_one_switch() -> None:
    inv = inventory("dgx-h100")
    plan = plan_pod(
        pod_ask(pod({"nvidia.com/gpu": "1", "koordinator.sh/rdma": "1"}, JOINT | WITH_VF)), inv, NodeUse(), {}
    )
    assert [e.minor for e in plan.gpu[0]] == [0]
    assert nics(plan) == [(0, "0000:18:00.0", ["0000:18:00.1"])]
    # NIC 0 taken whole by another pod: the GPU moves to where a NIC is free behind its switch
    busy = NodeUse(nic={0: 100})
    plan = plan_pod(pod_ask(pod({"nvidia.com/gpu": "1", "koordinator.sh/rdma": "1"}, JOINT)), inv, busy, {})
    assert [e.minor for e in plan.gpu[0]] == [1]
    assert nics(plan) == [(3, "0000:40:00.0", [])]  # no vfSelector: the PF itself
    # its lowest VF taken: the next one
    plan = plan_pod(
        pod_ask(pod({"nvidia.com/gpu": "1", "koordinator.sh/rdma": "1"}, JOINT | WITH_VF)),
        inv,
        NodeUse(vfs={"0000:18:00.1"}),
        {},
    )
    assert nics(plan) == [(0, "0000:18:00.0", ["0000:18:00.2"])]


def test_dgx_h100_same_pcie_takes_a_nic_on_each_gpus_switch() -> None:
    inv = inventory("dgx-h100")
    limits = {"nvidia.com/gpu": "2", "koordinator.sh/rdma": "1"}
    plan = plan_pod(pod_ask(pod(limits, SAME_PCIE | WITH_VF)), inv, NodeUse(), {})
    assert [e.minor for e in plan.gpu[0]] == [0, 1]
    assert [n for n, _, _ in nics(plan)] == [0, 3]
    # a switch of the pair without a free NIC: the pair moves where both have one
    plan = plan_pod(pod_ask(pod(limits, SAME_PCIE)), inv, NodeUse(nic={0: 100}), {})
    gpu_minors = [e.minor for e in plan.gpu[0]]
    switches = {inv.gpus[m].place.pcie_switch for m in gpu_minors}
    assert (
        0 not in gpu_minors and {inv.nic_by_minor(n).place.pcie_switch for n, _, _ in nics(plan)} == switches
    )  # type: ignore[union-attr]
    # GPUs fixed on a switch whose NIC is gone: SamePCIe cannot be had
    fixed = plan_pod(pod_ask(pod({"nvidia.com/gpu": "1"})), inv, NodeUse(), {}).gpu[0]
    with pytest.raises(NoRoom, match=r"none is free on 0000:16:00\.0"):
        plan_pod(pod_ask(pod(limits, SAME_PCIE)), inv, NodeUse(nic={0: 100}), {("nvidia.com/gpu", 0): fixed})


def test_nic_without_joint_goes_next_to_the_pods_gpus() -> None:
    inv = inventory("dgx-h100")
    plan = plan_pod(
        pod_ask(pod({"nvidia.com/gpu": "1", "koordinator.sh/rdma": "1"})), inv, whole(0, 1, 2, 3), {}
    )
    assert [e.minor for e in plan.gpu[0]] == [4]
    assert nics(plan) == [(6, "0000:9a:00.0", [])]  # GPU 4's switch
    # RDMA only: packed onto the NIC already in use
    plan = plan_pod(pod_ask(pod({"koordinator.sh/rdma": "10"})), inv, NodeUse(nic={5: 50}), {})
    assert nics(plan) == [(5, "0000:5e:00.0", [])]


def test_rdma_first_in_the_joint_list_puts_the_gpu_behind_the_nic() -> None:
    inv = inventory("dgx-h100")
    joint = {keys.DEVICE_JOINT_ALLOCATE: json.dumps({"deviceTypes": ["rdma", "gpu"]})}
    plan = plan_pod(
        pod_ask(pod({"nvidia.com/gpu": "1", "koordinator.sh/rdma": "1"}, joint)),
        inv,
        NodeUse(nic={5: 90}),
        {},
    )
    (nic,) = nics(plan)
    assert nic[0] == 5  # packed onto the NIC in use
    assert [e.minor for e in plan.gpu[0]] == [3]  # the GPU behind NIC 5's switch


def test_devices_annotated_to_a_pod_not_admitted_yet_are_the_last_resort() -> None:
    use = NodeUse(awaited_gpus={0, 1})
    assert gpus("dgx-h100", {"nvidia.com/gpu": "1"}, use) == [2]
    use = NodeUse(
        core=dict.fromkeys(range(2, 8), 100), ratio=dict.fromkeys(range(2, 8), 100), awaited_gpus={0, 1}
    )
    assert gpus("dgx-h100", {"nvidia.com/gpu": "2"}, use) == [0, 1]


def test_more_than_is_free_says_what_is_free() -> None:
    with pytest.raises(NoRoom, match=r"asks 2 whole GPUs; free here: GPU 7 100 %/100 %"):
        gpus("dgx-h100", {"nvidia.com/gpu": "2"}, whole(*range(7)))
    share = {"koordinator.sh/gpu-core": "60", "koordinator.sh/gpu-memory-ratio": "60"}
    with pytest.raises(NoRoom, match=r"free here: GPU 0 50 %/50 %, GPU 1 40 %/80 %"):
        gpus(
            "a100-pcie-4x-nvlink-pairs",
            share,
            NodeUse(core={0: 50, 1: 60, 2: 100, 3: 100}, ratio={0: 50, 1: 20, 2: 100, 3: 100}),
        )
    with pytest.raises(NoRoom, match="asks 1 RDMA NIC"):
        plan_pod(
            pod_ask(pod({"koordinator.sh/rdma": "1"})),
            inventory("dgx1-v100"),
            NodeUse(nic=dict.fromkeys(range(4), 100)),
            {},
        )


def test_kubelets_offer_bounds_the_choice() -> None:
    """GetPreferredAllocation's available IDs (kubelet's Topology Manager may have narrowed them
    to one NUMA node), or the IDs kubelet chose on its own."""
    inv = inventory("dgx1-v100")
    offered = Offered("nvidia.com/gpu", 0, {inv.gpus[m].uuid: 1 for m in (4, 5, 6, 7)})
    plan = plan_pod(pod_ask(pod({"nvidia.com/gpu": "2"})), inv, NodeUse(), {}, offered)
    assert [e.minor for e in plan.gpu[0]] == [4, 7]
    units = Offered("koordinator.sh/gpu-core", 0, {inv.gpus[2].uuid: 50, inv.gpus[3].uuid: 20})
    share = {"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}
    assert [e.minor for e in plan_pod(pod_ask(pod(share)), inv, NodeUse(), {}, units).gpu[0]] == [2]


def test_containers_served_before_are_kept_and_the_rest_chosen_around_them() -> None:
    inv = inventory("dgx1-v100")
    ask = pod_ask(pod({"nvidia.com/gpu": "2"}, helper={"nvidia.com/gpu": "1"}))
    first = plan_pod(ask, inv, NodeUse(), {})
    assert [[e.minor for e in c] for c in first.gpu] == [[0, 3], [1]]
    kept: dict[tuple[str, int], list[DeviceAllocation]] = {("nvidia.com/gpu", 0): first.gpu[0]}
    again = plan_pod(ask, inv, NodeUse(), kept)
    assert [[e.minor for e in c] for c in again.gpu] == [[0, 3], [1]]
    assert [e.minor for e in again.allocations()["gpu"]] == [0, 3, 1]


def test_requests_the_node_cannot_serve() -> None:
    with pytest.raises(ExpectationError, match=r"both nvidia\.com/gpu and koordinator\.sh/gpu-core"):
        pod_ask(pod({"nvidia.com/gpu": "1"}, side={"koordinator.sh/gpu-core": "50"}))
    with pytest.raises(ExpectationError, match="does not split"):
        pod_ask(pod({"koordinator.sh/gpu-core": "150", "koordinator.sh/gpu-memory-ratio": "150"}))
