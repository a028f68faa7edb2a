"""Protocol sections 2.2 and 5: inventory from a Device CR, used/free bookkeeping, summaries."""

from __future__ import annotations

import copy

import pytest

from allocator.core.node.gpu_features import gpu_model
from allocator.core.node.gpu_summary import GPUSummary
from allocator.core.node.inventory import LEVEL_NUMA, LEVEL_PCIE, build_inventory
from allocator.core.node.state import NodeState, state_from_objects
from apis import keys
from apis.annotations import parse_device_allocated
from apis.errors import CodecError
from tests.core.pods import pod
from tests.support.machines import dgx_h100_device, koordinator_example_device, l40s_device

CORE, MEM, RATIO = "koordinator.sh/gpu-core", "koordinator.sh/gpu-memory", "koordinator.sh/gpu-memory-ratio"
MI = 2**20


def alloc(text: str):
    return parse_device_allocated(text)


def whole(minor: int) -> str:
    return f'{{"minor":{minor},"resources":{{"{CORE}":"100","{RATIO}":"100","{MEM}":"81559Mi"}}}}'


def example_state() -> NodeState:
    inv = build_inventory(koordinator_example_device())
    return NodeState("gpu-node-01", inv, dict(inv.labels))


def test_inventory_of_the_protocol_example() -> None:
    inv = build_inventory(koordinator_example_device())
    assert inv.gpu_minors == tuple(range(8))
    gpu0 = inv.slot("gpu", 0)
    assert gpu0 is not None and gpu0.total == {CORE: 100, MEM: 81559 * MI, RATIO: 100}
    assert gpu0.pcie_scope == "pci0000:15"  # no pcieSwitchID: the root bus, like Koordinator
    assert inv.partition_source == "device" and inv.partition_honor
    assert [g.score for g in inv.partitions[4]] == [1]  # type: ignore[index]
    assert inv.tree is not None
    numa = inv.scopes_by_level[LEVEL_NUMA]
    assert [(s.name, s.minors) for s in numa] == [("0", (0, 1, 2, 3)), ("1", (4, 5, 6, 7))]
    assert [s.name for s in inv.scopes_by_level[LEVEL_PCIE]] == [
        "pci0000:15",
        "pci0000:37",
        "pci0000:97",
        "pci0000:b7",
    ]
    nic0 = inv.slot("rdma", 0)
    assert nic0 is not None and [vf.bus_id for vf in nic0.vfs][:2] == ["0000:1a:00.2", "0000:1a:00.3"]


def test_pcie_scope_is_the_switch_when_the_cr_has_it() -> None:
    inv = build_inventory(dgx_h100_device())
    assert [s.name for s in inv.scopes_by_level[LEVEL_PCIE]][:2] == ["0000:16:00.0", "0000:28:00.0"]
    gpu0, nic0 = inv.slot("gpu", 0), inv.slot("rdma", 0)
    assert gpu0 is not None and nic0 is not None and gpu0.pcie_scope == nic0.pcie_scope
    assert dict(inv.nvlink_domains) == {"nvswitch-0": 0xFF}
    l40s = build_inventory(l40s_device())
    assert [s.minors for s in l40s.scopes_by_level[LEVEL_PCIE]] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert not l40s.nvlink_domains


def test_unhealthy_devices_have_empty_totals_and_missing_topology_means_no_tree() -> None:
    dev = koordinator_example_device()
    dev["spec"]["devices"][3]["health"] = False
    del dev["spec"]["devices"][5]["topology"]
    inv = build_inventory(dev)
    slot3 = inv.slot("gpu", 3)
    assert slot3 is not None and slot3.total == {} and not (inv.gpu_healthy_mask >> 3 & 1)
    assert inv.tree is None


def test_unknown_numa_is_not_grouped() -> None:
    dev = koordinator_example_device()
    for d in dev["spec"]["devices"][:2]:
        d["topology"]["nodeID"] = -1
    inv = build_inventory(dev)
    assert inv.tree is not None
    names = [(c.level, c.name) for c in inv.tree.children]
    assert names == [(2, "0"), (2, "1"), (3, "pci0000:15")]


def test_builtin_hopper_table_from_node_labels() -> None:
    dev = koordinator_example_device()
    del dev["metadata"]["annotations"]
    inv = build_inventory(dev, {keys.GPU_MODEL: "H100", keys.GPU_VENDOR: "nvidia"})
    assert inv.partition_source == "builtin" and not inv.partition_honor
    assert [p.minors for p, _ in inv.partitions[2][0].partitions] == [(0, 1), (2, 3), (4, 5), (6, 7)]  # type: ignore[index]
    honor = build_inventory(dev, {keys.GPU_MODEL: "A100", keys.GPU_PARTITION_POLICY: "Honor"})
    assert honor.partitions is None and honor.partition_honor


def test_malformed_partition_table_is_ignored_with_a_warning() -> None:
    dev = koordinator_example_device()
    dev["metadata"]["annotations"][keys.GPU_PARTITIONS] = "null"
    inv = build_inventory(dev, {})
    assert inv.partitions is None and inv.warnings and "gpu-partitions" in inv.warnings[0]


def test_partition_groups_best_score_first() -> None:
    dev = koordinator_example_device()
    dev["metadata"]["annotations"][keys.GPU_PARTITIONS] = (
        '{"2":[{"minors":[0,1],"allocationScore":1},{"minors":[2,3],"allocationScore":5},{"minors":[4,5]}]}'
    )
    inv = build_inventory(dev)
    assert [g.score for g in inv.partitions[2]] == [5, 1, 0]  # type: ignore[index]


def test_malformed_device_raises_codec_error() -> None:
    dev = koordinator_example_device()
    dev["spec"]["devices"][0]["minor"] = "zero"
    with pytest.raises(CodecError):
        build_inventory(dev)


def test_add_and_remove_pods_keep_free_and_summaries() -> None:
    st = example_state()
    v0 = st.version
    assert GPUSummary.of(st).whole_free == 8 and GPUSummary.of(st).free_ratio == 800
    st.add_pod("ns/a", alloc(f'{{"gpu":[{whole(0)},{whole(1)}]}}'), 1000, 2**30)
    assert st.version > v0
    assert st.free["gpu"][0] == {CORE: 0, MEM: 0, RATIO: 0}
    assert (
        GPUSummary.of(st).used_mask == 0b11
        and GPUSummary.of(st).whole_free == 6
        and GPUSummary.of(st).free_ratio == 600
    )
    assert (st.requested_cpu_milli, st.requested_memory) == (1000, 2**30)
    half = f'{{"gpu":[{{"minor":2,"resources":{{"{CORE}":"50","{RATIO}":"50","{MEM}":"40779Mi"}}}}]}}'
    st.add_pod("ns/b", alloc(half))
    assert st.free["gpu"][2] == {CORE: 50, MEM: 40780 * MI, RATIO: 50}
    assert GPUSummary.of(st).free_pct == (0, 0, 50, 100, 100, 100, 100, 100)
    st.remove_pod("ns/a")
    assert (
        GPUSummary.of(st).used_mask == 0b100
        and GPUSummary.of(st).whole_free == 7
        and st.requested_cpu_milli == 0
    )
    assert st.remove_pod("ns/a") is False


def test_adding_a_key_again_replaces_it() -> None:
    st = example_state()
    st.add_pod("ns/a", alloc(f'{{"gpu":[{whole(0)}]}}'))
    st.add_pod("ns/a", alloc(f'{{"gpu":[{whole(1)}]}}'))
    assert GPUSummary.of(st).used_mask == 0b10


def test_free_is_clamped_and_used_only_minors_exist() -> None:
    st = example_state()
    over = (
        f'{{"gpu":[{{"minor":0,"resources":{{"{CORE}":"150"}}}},'
        f'{{"minor":9,"resources":{{"{CORE}":"10"}}}}]}}'
    )
    st.add_pod("ns/x", alloc(over))
    assert st.free["gpu"][0][CORE] == 0
    assert st.free["gpu"][9] == {CORE: 0}  # absent from the CR: an empty total, so nothing is free


def test_vfs_are_taken_and_released() -> None:
    st = example_state()
    vf = (
        '{"rdma":[{"minor":0,"resources":{"koordinator.sh/rdma":"1"},'
        '"extension":{"vfs":[{"minor":-1,"busID":"0000:1a:00.2"}]}}]}'
    )
    st.add_pod("ns/v", alloc(vf))
    assert st.vf_taken["rdma"][0] == {"0000:1a:00.2"} and st.free_vfs("rdma", 0) == 3
    assert st.free["rdma"][0] == {"koordinator.sh/rdma": 99}
    st.remove_pod("ns/v")
    assert st.free_vfs("rdma", 0) == 4


def test_device_update_reapplies_pods_and_delete_marks_all_unhealthy() -> None:
    st = example_state()
    st.add_pod("ns/a", alloc(f'{{"gpu":[{whole(0)}]}}'))
    dev = koordinator_example_device()
    dev["spec"]["devices"][1]["health"] = False
    st.set_inventory(build_inventory(dev))
    assert (
        GPUSummary.of(st).used_mask == 1
        and GPUSummary.of(st).whole_free == 6
        and GPUSummary.of(st).healthy_count == 7
    )
    st.devices_gone()
    assert (
        GPUSummary.of(st).whole_free == 0
        and GPUSummary.of(st).healthy_count == 0
        and GPUSummary.of(st).free_pct == (0,) * 8
    )
    assert st.inventory is not None and st.inventory.slot("gpu", 0).id  # type: ignore[union-attr]


def test_fgd_summary_properties() -> None:
    node = {
        "metadata": {"name": "n", "labels": {keys.GPU_MODEL: "H800"}},
        "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"}},
    }
    bound = pod({"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "1"}, name="b", node="n")
    bound["metadata"]["annotations"] = {keys.DEVICE_ALLOCATED: f'{{"gpu":[{whole(3)}]}}'}
    st = state_from_objects(node, koordinator_example_device(), [bound])
    assert st.cpu_free_milli == 60000 and st.memory_free == 504 * 2**30
    assert gpu_model(st) == "H800" and GPUSummary.of(st).healthy_count == 8
    assert GPUSummary.of(st).free_pct[3] == 0 and sum(GPUSummary.of(st).free_pct) == 700
    assert st.allocatable["pods"] == 110 and st.pod_count == 1


def test_state_from_objects_copies_device_labels_without_a_node() -> None:
    st = state_from_objects(None, koordinator_example_device(), [])
    assert st.name == "gpu-node-01" and st.labels[keys.GPU_MODEL] == "H800"


def test_inventory_is_not_shared_mutable() -> None:
    dev = koordinator_example_device()
    inv = build_inventory(copy.deepcopy(dev))
    with pytest.raises(TypeError):
        inv.slot("gpu", 0).total[CORE] = 1  # type: ignore[index, union-attr]


def test_largest_free_set_per_scope() -> None:
    st = example_state()
    st.add_pod("ns/a", alloc(f'{{"gpu":[{whole(0)},{whole(2)},{whole(4)}]}}'))
    assert GPUSummary.of(st).largest_free_set(LEVEL_PCIE) == (2, "pci0000:b7")
    assert GPUSummary.of(st).largest_free_set(LEVEL_NUMA) == (3, "1")
    st.add_pod("ns/b", alloc(f'{{"gpu":[{whole(6)}]}}'))
    assert GPUSummary.of(st).largest_free_set(LEVEL_PCIE) == (1, "pci0000:15")
