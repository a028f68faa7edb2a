"""Protocol sections 8.2 and 8.4: per-device selection and joint GPU + RDMA allocation."""

from __future__ import annotations

import json

import pytest

from allocator.core import reasons as rs
from allocator.core.devices.allocate import Allocation, allocate
from allocator.core.reasons import Rejection
from allocator.core.request.parse import pod_request
from tests.core.allocating import LEAST, MOST, ok, rejected, run
from tests.core.nodes import (
    CORE,
    MEM,
    RATIO,
    RDMA,
    plain_example_device,
    state_of,
    use_gpus,
    use_vf,
)
from tests.core.pods import hint, joint, pod
from tests.support.machines import dgx_h100_device

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
