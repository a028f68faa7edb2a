"""Protocol sections 4 and 7-9: which devices a pod gets, and the annotation written for them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from allocator.core import reasons as rs
from allocator.core.devices.allocate import Allocation, allocate, fits
from allocator.core.node.state import NodeState
from allocator.core.reasons import Rejection
from allocator.core.request.parse import pod_request
from allocator.core.scoring.device import DeviceScoring
from apis import keys
from tests.core.nodes import (
    CORE,
    H800_MEMORY,
    MEM,
    RATIO,
    RDMA,
    plain_example_device,
    state_of,
    use_gpus,
    use_vf,
)
from tests.core.pods import gpus, hint, joint, pod
from tests.support.machines import dgx_h100_device, koordinator_example_device, l40s_device

DATA = Path(__file__).parent / "data"
MOST, LEAST = DeviceScoring("MostAllocated"), DeviceScoring("LeastAllocated")


def ok(result: Allocation | Rejection) -> Allocation:
    assert isinstance(result, Allocation), result
    return result


def rejected(result: Allocation | Rejection) -> Rejection:
    assert isinstance(result, Rejection), result
    return result


def run(state: NodeState, p: dict, **kwargs) -> Allocation | Rejection:
    """allocate, checking on the way that fits agrees with it."""
    req = pod_request(p)
    result = allocate(state, req, **kwargs)
    verdict = fits(state, req)
    if "scoring" not in kwargs and "numa_mask" not in kwargs and "required" not in kwargs:
        assert verdict == (result if isinstance(result, Rejection) else None)
    return result


# -- 4.3: the worked example, byte for byte ------------------------------------------------------------


def test_worked_example_annotation_is_byte_identical() -> None:
    dev = koordinator_example_device()
    state = state_of(dev, dev["metadata"]["labels"])
    use_gpus(state, 0, 1)
    use_vf(state, 0, "0000:1a:00.2")
    p = pod(
        {"nvidia.com/gpu": "4", RDMA: "1"},
        annotations={
            keys.DEVICE_ALLOCATE_HINT: '{"rdma":{"vfSelector":{"matchLabels":{"type":"general"}}}}',
            keys.DEVICE_JOINT_ALLOCATE: '{"deviceTypes":["gpu","rdma"],"requiredScope":"SamePCIe"}',
            keys.GPU_PARTITION_SPEC: '{"allocatePolicy":"Restricted","ringBusBandwidth":"200Gi"}',
        },
    )
    expected = (DATA / "koord-example-allocated.json").read_text().strip()
    for scoring in (None, LEAST, MOST):
        got = ok(run(state, p, scoring=scoring) if scoring else run(state, p))
        assert got.to_json() == expected
        assert got.path == "partition"


# -- 4.2: memory and ratio completed from the GPU's size -------------------------------------------------


@pytest.mark.parametrize(
    ("requests", "resources"),
    [
        ({MEM: "8Gi"}, {MEM: "8Gi", RATIO: str(int(8 * 2**30 / H800_MEMORY * 100))}),
        ({RATIO: "50"}, {RATIO: "50", MEM: str(50 * H800_MEMORY // 100)}),
        ({CORE: "30", RATIO: "30"}, {CORE: "30", RATIO: "30", MEM: str(30 * H800_MEMORY // 100)}),
    ],
)
def test_gpu_memory_and_ratio_are_filled(requests: dict[str, str], resources: dict[str, str]) -> None:
    got = ok(run(state_of(plain_example_device()), pod(requests)))
    entry = json.loads(got.to_json())["gpu"][0]
    from apis.quantity import Quantity

    assert {k: Quantity.parse(v) for k, v in entry["resources"].items()} == {
        k: Quantity.parse(v) for k, v in resources.items()
    }
    assert entry["id"].startswith("GPU-1a2b3c4d")


# -- 7: the per-node flow -----------------------------------------------------------------------------


def test_pods_without_devices_always_fit() -> None:
    state = NodeState("cpu-node")
    got = ok(run(state, pod({"cpu": "1"})))
    assert not got.devices and got.to_json() == "{}"


def test_node_without_a_device_cr_rejects_device_pods() -> None:
    r = rejected(run(NodeState("x"), pod(gpus(1))))
    assert r.code == rs.NO_DEVICE_CR and r.unresolvable


def test_node_without_the_device_type() -> None:
    dev = plain_example_device()
    dev["spec"]["devices"] = [d for d in dev["spec"]["devices"] if d["type"] == "gpu"]
    state = state_of(dev)
    r = rejected(run(state, pod({RDMA: "100"})))
    assert (r.code, r.unresolvable, r.message) == ("Insufficient rdma devices", True, "node has no RDMA NICs")
    gpu_only = dev.copy()
    gpu_only["spec"] = {"devices": []}
    r = rejected(run(state_of(gpu_only), pod(gpus(1))))
    assert (r.code, r.unresolvable) == ("Insufficient gpu devices", True)


def test_isolation_provider_must_match_for_shared_pods() -> None:
    shared = pod({"koordinator.sh/gpu": "50"}, labels={keys.GPU_ISOLATION_PROVIDER: keys.HAMI_CORE})
    state = state_of(plain_example_device())
    r = rejected(run(state, shared))
    assert r.code == rs.ISOLATION_PROVIDER and "HAMi-core" in r.message
    state.set_labels({keys.GPU_ISOLATION_PROVIDER: keys.HAMI_CORE})
    assert ok(run(state, shared)).minors("gpu") == [0]
    whole = pod(gpus(1), labels={keys.GPU_ISOLATION_PROVIDER: keys.HAMI_CORE})
    assert ok(run(state_of(plain_example_device()), whole)).minors("gpu") == [0]


@pytest.mark.parametrize(
    ("requests", "hints", "minors", "per_device"),
    [
        ({RDMA: "200"}, None, [0, 1], "100"),
        ({RDMA: "1"}, {"allocateStrategy": "ApplyForAll"}, [0, 1, 2, 3], "1"),
        ({RDMA: "2"}, {"allocateStrategy": "RequestsAsCount"}, [0, 1], "1"),
        (
            {RDMA: "2"},
            {"allocateStrategy": "RequestsAsCount", "exclusivePolicy": "DeviceLevel"},
            [0, 1],
            "100",
        ),
        ({RDMA: "50"}, None, [0], "50"),
    ],
)
def test_rdma_counts(
    requests: dict[str, str], hints: dict | None, minors: list[int], per_device: str
) -> None:
    p = pod(requests, annotations=hint(rdma=hints) if hints else None)
    got = ok(run(state_of(plain_example_device()), p))
    entries = json.loads(got.to_json())["rdma"]
    assert [e["minor"] for e in entries] == minors
    assert {e["resources"][RDMA] for e in entries} == {per_device}
    assert all(e["id"].startswith("0000:") for e in entries)


def test_apply_for_all_with_a_selector_that_matches_nothing() -> None:
    p = pod(
        {RDMA: "1"},
        annotations=hint(
            rdma={"allocateStrategy": "ApplyForAll", "selector": {"matchLabels": {"type": "x"}}}
        ),
    )
    r = rejected(run(state_of(plain_example_device()), p))
    assert (r.code, r.unresolvable) == ("Insufficient rdma devices", True)


def test_vf_selector_needs_vf_groups() -> None:
    dev = plain_example_device()
    for d in dev["spec"]["devices"]:
        d.pop("vfGroups", None)
    r = rejected(run(state_of(dev), pod({RDMA: "1"}, annotations=hint(rdma={"vfSelector": {}}))))
    assert (r.code, r.unresolvable) == ("Insufficient rdma VirtualFunctions", True)


# -- 8.3: the scope walk ------------------------------------------------------------------------------


def test_walk_prefers_scopes_already_in_use() -> None:
    """The protocol's example: GPU 5 used, 1 GPU wanted -> GPU 4 (its PCIe scope is in use)."""
    state = state_of(plain_example_device())
    use_gpus(state, 5)
    got = ok(run(state, pod(gpus(1))))
    assert (got.minors("gpu"), got.path) == ([4], "topology")


def test_walk_bin_packs_numa_nodes() -> None:
    state = state_of(plain_example_device())
    use_gpus(state, 0)
    p = pod(gpus(3), annotations=hint(gpu={"requiredTopologyScope": "NUMANode"}))
    assert ok(run(state, p)).minors("gpu") == [1, 2, 3]


def test_required_pcie_scope() -> None:
    state = state_of(plain_example_device())
    use_gpus(state, 0, 2)
    p = pod(gpus(2), annotations=hint(gpu={"requiredTopologyScope": "PCIe"}))
    assert ok(run(state, p)).minors("gpu") == [4, 5]
    use_gpus(state, 4, 6)
    r = rejected(run(state, p))
    assert r.code == rs.INSUFFICIENT_SCOPED and not r.unresolvable
    assert (
        r.explained
        == "need 2 free GPUs within one PCIe switch; the largest free set is 1 (switch pci0000:15)"
    )


def test_required_scope_on_real_pcie_switches() -> None:
    state = state_of(l40s_device())
    use_gpus(state, 0, 3)
    p = pod(gpus(2), annotations=hint(gpu={"requiredTopologyScope": "PCIe"}))
    got = ok(run(state, p))
    assert got.minors("gpu") == [4, 5]
    use_gpus(state, 4, 6)
    r = rejected(run(state, p))
    assert "largest free set is 1 (switch 0000:19:00.0)" in r.explained


def test_device_scope_means_one_gpu() -> None:
    state = state_of(plain_example_device())
    one = pod(gpus(1), annotations=hint(gpu={"requiredTopologyScope": "Device"}))
    assert ok(run(state, one)).minors("gpu") == [0]
    two = pod(gpus(2), annotations=hint(gpu={"requiredTopologyScope": "Device"}))
    r = rejected(run(state, two))
    assert r.code == rs.UNSATISFIABLE_DEVICE_SCOPE and r.unresolvable and "asks for 2" in r.message


def test_missing_topology_tree() -> None:
    dev = plain_example_device()
    for d in dev["spec"]["devices"]:
        d.pop("topology", None)
    state = state_of(dev)
    scoped = pod(gpus(2), annotations=hint(gpu={"requiredTopologyScope": "PCIe"}))
    r = rejected(run(state, scoped))
    assert (r.code, r.unresolvable) == (rs.MISSING_TOPOLOGY_TREE, True)
    got = ok(run(state, pod(gpus(2))))
    assert (got.minors("gpu"), got.path) == ([0, 1], "plain")


def test_multi_shared_gpu() -> None:
    shared = {"koordinator.sh/gpu.shared": "2", CORE: "100", RATIO: "100"}
    state = state_of(plain_example_device())
    r = rejected(run(state, pod(shared, annotations=hint(gpu={"requiredTopologyScope": "NUMANode"}))))
    assert (r.code, r.unresolvable) == (rs.UNSUPPORTED_MULTI_SHARED, True)
    got = ok(run(state, pod(shared)))
    assert got.minors("gpu") == [0, 1] and got.path == "plain"
    assert json.loads(got.to_json())["gpu"][0]["resources"][CORE] == "50"


def test_pcie_exclusive_policy_keeps_only_idle_switches() -> None:
    state = state_of(plain_example_device())
    use_gpus(state, 0)
    assert ok(run(state, pod(gpus(1)))).minors("gpu") == [1]
    exclusive = pod(gpus(1), annotations=hint(gpu={"exclusivePolicy": "PCIeLevel"}))
    assert ok(run(state, exclusive)).minors("gpu") == [2]


def test_nvlink_domain_is_preferred_for_multi_gpu_requests() -> None:
    dev = plain_example_device()
    domains = {0: "a", 1: "a", 4: "a", 5: "a", 2: "b", 3: "b", 6: "b", 7: "b"}
    for d in dev["spec"]["devices"]:
        if d["type"] == "gpu":
            d["nvlink"] = {"domain": domains[d["minor"]]}
    state = state_of(dev)
    use_gpus(state, 0)
    got = ok(run(state, pod(gpus(4))))
    assert got.minors("gpu") == [2, 3, 6, 7]  # Koordinator's walk would take NUMA node 1: 4, 5, 6, 7
    explain: list[str] = []
    allocate(state, pod_request(pod(gpus(4))), explain=explain)
    assert any("NVLink domain b" in line for line in explain)


def test_shared_gpu_bin_packing_uses_the_real_device_score() -> None:
    """⚠ Koordinator swaps free and total here, so every partly used GPU ties at 100."""
    state = state_of(plain_example_device())
    use_gpus(state, 0, share=25)
    use_gpus(state, 1, share=75)
    p = pod({"koordinator.sh/gpu": "20"})
    assert ok(run(state, p, scoring=MOST)).minors("gpu") == [1]
    assert ok(run(state, p)).minors("gpu") == [0]  # no scorer (Filter path): lowest minor of the best scope
    got = ok(run(state, p, scoring=LEAST))
    assert got.minors("gpu") == [0]


def test_shared_gpu_rejection_message() -> None:
    state = state_of(plain_example_device())
    use_gpus(state, *range(8), share=60)
    r = rejected(run(state, pod({"koordinator.sh/gpu": "50"})))
    assert r.code == "Insufficient gpu devices" and not r.unresolvable
    assert r.explained == "need 1 GPU with 50% compute and 50% memory free; no GPU has that much free"


def test_whole_gpu_rejection_message() -> None:
    state = state_of(plain_example_device())
    use_gpus(state, 0, 1, 2, 3, 4, 5)
    r = rejected(run(state, pod(gpus(4))))
    assert (r.code, r.explained) == ("Insufficient gpu devices", "need 4 free GPUs; 2 are free")


def test_unhealthy_gpus_are_never_chosen() -> None:
    dev = plain_example_device()
    for d in dev["spec"]["devices"][:7]:
        d["health"] = False
    state = state_of(dev)
    assert ok(run(state, pod(gpus(1)))).minors("gpu") == [7]
    assert rejected(run(state, pod(gpus(2)))).explained == "need 2 free GPUs; 1 is free"


def test_numa_mask_and_selector_restrict_candidates() -> None:
    dev = plain_example_device()
    for d in dev["spec"]["devices"]:
        if d["type"] == "gpu":
            d["labels"] = {"pool": "a" if d["minor"] % 2 else "b"}
    state = state_of(dev)
    got = ok(allocate(state, pod_request(pod(gpus(2))), numa_mask=[1]))
    assert got.minors("gpu") == [4, 5]
    sel = pod(gpus(2), annotations=hint(gpu={"selector": {"matchLabels": {"pool": "a"}}}))
    assert ok(run(state, sel)).minors("gpu") == [1, 3]
    r = rejected(run(state, pod(gpus(5), annotations=hint(gpu={"selector": {"matchLabels": {"pool": "a"}}}))))
    assert r.explained == "need 5 free GPUs matching the selector; 4 are free"


def test_required_bounds() -> None:
    state = state_of(plain_example_device())
    bound = {
        "gpu": {6: {CORE: 100, RATIO: 100, MEM: H800_MEMORY}, 7: {CORE: 100, RATIO: 100, MEM: H800_MEMORY}}
    }
    got = ok(allocate(state, pod_request(pod(gpus(2))), required=bound))
    assert got.minors("gpu") == [6, 7]
    assert isinstance(allocate(state, pod_request(pod(gpus(3))), required=bound), Rejection)


# -- 8.4: per-device selection -------------------------------------------------------------------------


def test_plain_selection_follows_the_device_scoring() -> None:
    state = state_of(plain_example_device())
    use_vf(state, 0, "0000:1a:00.2")
    p = pod({RDMA: "1"})
    assert ok(run(state, p)).minors("rdma") == [0]  # no scorer: lowest minor
    assert ok(run(state, p, scoring=MOST)).minors("rdma") == [0]
    assert ok(run(state, p, scoring=LEAST)).minors("rdma") == [1]


def test_lowest_free_vf_is_chosen() -> None:
    state = state_of(plain_example_device())
    use_vf(state, 0, "0000:1a:00.2")
    use_vf(state, 0, "0000:1a:00.4")
    got = ok(run(state, pod({RDMA: "1"}, annotations=hint(rdma={"vfSelector": {}}))))
    assert json.loads(got.to_json())["rdma"][0]["extension"] == {
        "vfs": [{"minor": -1, "busID": "0000:1a:00.3"}]
    }


def test_device_without_a_free_vf_is_skipped() -> None:
    state = state_of(plain_example_device())
    for fn in (2, 3, 4, 5):
        use_vf(state, 0, f"0000:1a:00.{fn}")
    got = ok(
        run(
            state,
            pod({RDMA: "1"}, annotations=hint(rdma={"vfSelector": {"matchLabels": {"type": "general"}}})),
        )
    )
    assert got.minors("rdma") == [1]
    none = pod({RDMA: "1"}, annotations=hint(rdma={"vfSelector": {"matchLabels": {"type": "other"}}}))
    r = rejected(run(state, none))
    assert (r.code, r.explained) == ("Insufficient rdma devices", "need 1 RDMA NIC with a free VF; 0 qualify")


# -- 8.2: joint allocation ------------------------------------------------------------------------------


def test_joint_without_same_pcie_takes_one_nic_per_gpu_pcie() -> None:
    state = state_of(plain_example_device())
    p = pod({"nvidia.com/gpu": "3", RDMA: "1"}, annotations=joint("gpu", "rdma", same_pcie=False))
    got = ok(run(state, p))
    assert got.minors("gpu") == [0, 1, 2] and got.minors("rdma") == [0, 1]


def test_same_pcie_violation() -> None:
    state = state_of(plain_example_device())
    for fn in (2, 3, 4, 5):
        use_vf(state, 1, f"0000:3c:00.{fn}")
    p = pod(
        {"nvidia.com/gpu": "4", RDMA: "1"},
        annotations={**hint(rdma={"vfSelector": {}}), **joint("gpu", "rdma")},
    )
    r = rejected(run(state, p))
    assert r.code == rs.JOINT_VIOLATION and not r.unresolvable
    assert (
        r.explained == "need a free RDMA NIC on the PCIe switch of every chosen GPU; none on PCIe pci0000:37"
    )


def test_dgx_h100_pairs_each_gpu_with_the_nic_on_its_switch() -> None:
    state = state_of(dgx_h100_device())
    use_gpus(state, 0)
    use_vf(state, 1, "0000:2b:00.2")
    p = pod(
        {"nvidia.com/gpu": "4", RDMA: "1"},
        annotations={**hint(rdma={"vfSelector": {}}), **joint("gpu", "rdma")},
    )
    got = ok(run(state, p, scoring=LEAST))
    entries = json.loads(got.to_json())
    assert [e["minor"] for e in entries["gpu"]] == [4, 5, 6, 7]
    assert [e["minor"] for e in entries["rdma"]] == [4, 5, 6, 7]
    assert entries["rdma"][0]["extension"]["vfs"][0]["busID"] == "0000:9b:00.2"
    two = pod(
        {"nvidia.com/gpu": "2", RDMA: "1"},
        annotations={**hint(rdma={"vfSelector": {}}), **joint("gpu", "rdma")},
    )
    got = ok(run(state, two))
    assert got.minors("gpu") == [1, 2] and got.minors("rdma") == [1, 2]
    assert json.loads(got.to_json())["rdma"][0]["extension"]["vfs"][0]["busID"] == "0000:2b:00.3"


def test_rdma_as_primary() -> None:
    state = state_of(plain_example_device())
    p = pod({"nvidia.com/gpu": "1", RDMA: "1"}, annotations=joint("rdma", "gpu"))
    got = ok(run(state, p))
    assert got.minors("rdma") == [0] and got.minors("gpu") == [0]


# -- 9: partitions -----------------------------------------------------------------------------------------

HOPPER_NODE = {keys.GPU_VENDOR: "nvidia", keys.GPU_MODEL: "H100"}


def test_partition_bin_pack_worked_numbers() -> None:
    state = state_of(plain_example_device(), HOPPER_NODE)
    use_gpus(state, 4)
    explain: list[str] = []
    got = ok(allocate(state, pod_request(pod(gpus(1))), explain=explain))
    assert (got.minors("gpu"), got.path) == ([5], "partition")
    scores = {line.split(":")[0]: int(line.rsplit(" ", 1)[1]) for line in explain if "bin-pack" in line}
    assert scores == {
        "partition 0": 2,
        "partition 1": 2,
        "partition 2": 2,
        "partition 3": 2,
        "partition 5": 103,
        "partition 6": 102,
        "partition 7": 102,
    }


def test_honour_without_a_table_or_size() -> None:
    state = state_of(plain_example_device(), {keys.GPU_MODEL: "A100", keys.GPU_PARTITION_POLICY: "Honor"})
    r = rejected(run(state, pod(gpus(1))))
    assert (r.code, r.unresolvable) == (rs.MISSING_PARTITION_TABLE, True)
    honor = state_of(koordinator_example_device())
    r = rejected(run(honor, pod(gpus(3))))
    assert (r.code, r.unresolvable) == (rs.UNSUPPORTED_GPU_COUNT, True)
    assert r.message == "no GPU partition holds 3 GPUs (partition sizes: 1, 2, 4, 8)"
    shared = ok(run(honor, pod({"koordinator.sh/gpu": "50"})))
    assert shared.path == "topology"


def test_honoured_partitions_that_are_all_taken() -> None:
    state = state_of(koordinator_example_device())
    use_gpus(state, 0, 4)
    r = rejected(run(state, pod(gpus(4))))
    assert (r.code, r.unresolvable, r.message) == (
        rs.INSUFFICIENT_PARTITIONS,
        False,
        "need a free 4-GPU partition; none is free",
    )
    spec = {keys.GPU_PARTITION_SPEC: {"ringBusBandwidth": "300Gi"}}
    r = rejected(run(state_of(koordinator_example_device()), pod(gpus(4), annotations=spec)))
    assert r.message == "need a free 4-GPU partition with ring bandwidth of at least 300Gi; none is free"


def test_prefer_policy_falls_back_to_the_walk() -> None:
    state = state_of(plain_example_device(), HOPPER_NODE)
    use_gpus(state, 0, 4)
    got = ok(run(state, pod(gpus(4))))
    assert got.path == "topology" and got.minors("gpu") == [1, 2, 3, 5]


def test_higher_allocation_score_group_first_and_restricted() -> None:
    dev = koordinator_example_device()
    dev["metadata"]["annotations"][keys.GPU_PARTITIONS] = json.dumps(
        {"2": [{"minors": [0, 1], "allocationScore": 1}, {"minors": [2, 3], "allocationScore": 5}]}
    )
    state = state_of(dev)
    assert ok(run(state, pod(gpus(2)))).minors("gpu") == [2, 3]
    use_gpus(state, 2)
    assert ok(run(state, pod(gpus(2)))).minors("gpu") == [0, 1]
    restricted = pod(gpus(2), annotations={keys.GPU_PARTITION_SPEC: {"allocatePolicy": "Restricted"}})
    assert rejected(run(state, restricted)).code == rs.INSUFFICIENT_PARTITIONS


# -- determinism ---------------------------------------------------------------------------------------------


def test_same_input_same_output() -> None:
    state = state_of(dgx_h100_device())
    use_gpus(state, 1, 6)
    p = pod(
        {"nvidia.com/gpu": "2", RDMA: "1"},
        annotations={**hint(rdma={"vfSelector": {}}), **joint("gpu", "rdma")},
    )
    outs = {ok(run(state, p, scoring=MOST)).to_json() for _ in range(5)}
    assert len(outs) == 1


def test_partitions_must_respect_a_required_scope() -> None:
    """Koordinator takes the partition whatever the scope; we take only partitions inside it."""
    state = state_of(koordinator_example_device())
    in_scope = pod(gpus(2), annotations=hint(gpu={"requiredTopologyScope": "PCIe"}))
    assert ok(run(state, in_scope)).minors("gpu") == [0, 1]  # {0,1} is one partition and one switch
    four = pod(gpus(4), annotations=hint(gpu={"requiredTopologyScope": "PCIe"}))
    r = rejected(run(state, four))
    assert (r.code, r.message) == (
        rs.INSUFFICIENT_PARTITIONS,
        "need a free 4-GPU partition within one PCIe switch; none is free",
    )


def test_shared_share_boundary() -> None:
    state = state_of(plain_example_device())
    use_gpus(state, *range(8), share=50)
    assert ok(run(state, pod({"koordinator.sh/gpu": "50"}))).minors("gpu") == [0]
    assert rejected(run(state, pod({"koordinator.sh/gpu": "51"}))).message.startswith(
        "need 1 GPU with 51% compute"
    )


def _gpus_without_topology_two_nic_switches() -> dict:
    """GPUs without topology (no scope tree: the plain path) and NICs on two root buses."""
    gpu = {RATIO: "100", CORE: "100", MEM: "16Gi"}
    devices = [
        {"type": "gpu", "id": f"GPU-{m}", "minor": m, "health": True, "resources": gpu} for m in (0, 1)
    ]
    devices += [
        {
            "type": "rdma",
            "id": f"0000:{m:02x}:00.0",
            "minor": m,
            "health": True,
            "resources": {RDMA: "100"},
            "topology": {"socketID": 0, "nodeID": 0, "pcieID": pcie, "busID": f"0000:{m:02x}:00.0"},
        }
        for m, pcie in ((0, "pci0000:15"), (1, "pci0000:37"))
    ]
    return {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Device",
        "metadata": {"name": "n"},
        "spec": {"devices": devices},
    }


@pytest.mark.parametrize("same_pcie", [False, True])
def test_secondary_gpu_count_is_never_stretched_to_the_primary_switches(same_pcie: bool) -> None:
    """Found by the Hypothesis property: rdma-first joint allocation over two switches must not
    hand a pod that asked for 30% of one GPU a second card (compatibility #17)."""
    state = state_of(_gpus_without_topology_two_nic_switches())
    p = pod({RDMA: "200", "koordinator.sh/gpu": "30"}, annotations=joint("rdma", "gpu", same_pcie=same_pcie))
    got = allocate(state, pod_request(p))
    if same_pcie:
        assert isinstance(got, Rejection) and got.code == rs.JOINT_VIOLATION
    else:
        assert isinstance(got, Allocation)
        assert len(got.devices["gpu"]) == 1
        assert len(got.devices["rdma"]) == 2
