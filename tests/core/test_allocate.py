"""Protocol sections 4, 7 and 9: which devices a pod gets, and the annotation written for them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from allocator.core import reasons as rs
from allocator.core.devices.allocate import allocate
from allocator.core.node.state import NodeState
from allocator.core.request.parse import pod_request
from apis import keys
from tests.core.allocating import LEAST, MOST, ok, rejected, run
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
from tests.support.machines import dgx_h100_device, koordinator_example_device

DATA = Path(__file__).parent / "data"


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
