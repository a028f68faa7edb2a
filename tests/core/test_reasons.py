"""Protocol section 10: every rejection carries Koordinator's reason code, UU vs U, and a short
message that names neither the pod nor the node (kube-scheduler counts equal reasons together)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from allocator.core import reasons as rs
from allocator.core.devices.allocate import allocate, fits
from allocator.core.node.state import NodeState
from allocator.core.reasons import Rejection
from allocator.core.request.parse import pod_request
from apis import keys
from tests.core.nodes import RDMA, plain_example_device, state_of, use_gpus, use_vf
from tests.core.pods import gpus, hint, joint, pod
from tests.support.machines import koordinator_example_device

Case = tuple[Callable[[], NodeState], dict[str, Any], str, bool]


def example() -> NodeState:
    return state_of(plain_example_device())


def honoured() -> NodeState:
    return state_of(koordinator_example_device())


def no_topology() -> NodeState:
    dev = plain_example_device()
    for d in dev["spec"]["devices"]:
        d.pop("topology", None)
    return state_of(dev)


def no_vfs() -> NodeState:
    dev = plain_example_device()
    for d in dev["spec"]["devices"]:
        d.pop("vfGroups", None)
    return state_of(dev)


def busy() -> NodeState:
    state = example()
    use_gpus(state, 0, 2, 4, 6)
    for fn in (2, 3, 4, 5):
        use_vf(state, 1, f"0000:3c:00.{fn}")
    return state


def gpu_only() -> NodeState:
    dev = plain_example_device()
    dev["spec"]["devices"] = [d for d in dev["spec"]["devices"] if d["type"] == "gpu"]
    return state_of(dev)


VF_JOINT = {**hint(rdma={"vfSelector": {}}), **joint("gpu", "rdma")}
CASES: dict[str, Case] = {
    "unit": (
        example,
        pod({"koordinator.sh/gpu": "150"}),
        "invalid resource unit koordinator.sh/gpu: 150",
        True,
    ),
    "combination": (
        example,
        pod({"koordinator.sh/gpu-core": "10"}),
        "invalid resource device requests: [koordinator.sh/gpu-core]",
        True,
    ),
    "hint": (
        example,
        pod(gpus(1), annotations={keys.DEVICE_ALLOCATE_HINT: "{"}),
        "invalid DeviceAllocateHint",
        True,
    ),
    "selector": (
        example,
        pod(gpus(1), annotations=hint(gpu={"selector": {"matchLabels": {"a b": "c"}}})),
        "invalid Selector of DeviceHint, deviceType: gpu",
        True,
    ),
    "vf selector": (
        example,
        pod({RDMA: "1"}, annotations=hint(rdma={"vfSelector": {"matchExpressions": [{"key": "k"}]}})),
        "invalid VFSelector of DeviceHint, deviceType: rdma",
        True,
    ),
    "joint": (
        example,
        pod(gpus(1), annotations={keys.DEVICE_JOINT_ALLOCATE: "x"}),
        "invalid DeviceJointAllocate",
        True,
    ),
    "partition spec": (
        example,
        pod(gpus(1), annotations={keys.GPU_PARTITION_SPEC: '{"ringBusBandwidth": "fast"}'}),
        "invalid GPUPartitionSpec",
        True,
    ),
    "device-allocated": (
        example,
        pod(gpus(1), annotations={keys.DEVICE_ALLOCATED: '{"gpu": 1}'}),
        "scheduling.koordinator.sh/device-allocated.gpu",
        True,
    ),
    "isolation": (
        example,
        pod({"koordinator.sh/gpu": "10"}, labels={keys.GPU_ISOLATION_PROVIDER: keys.HAMI_CORE}),
        "GPUIsolationProviderHAMICore not found on the node",
        True,
    ),
    "no such devices": (gpu_only, pod({RDMA: "1"}), "Insufficient rdma devices", True),
    "too few devices": (busy, pod(gpus(5)), "Insufficient gpu devices", False),
    "no VFs": (
        no_vfs,
        pod({RDMA: "1"}, annotations=hint(rdma={"vfSelector": {}})),
        "Insufficient rdma VirtualFunctions",
        True,
    ),
    "joint rules": (
        busy,
        pod({"nvidia.com/gpu": "2", RDMA: "1"}, annotations=VF_JOINT),
        rs.JOINT_VIOLATION,
        False,
    ),
    "no partition table": (
        lambda: state_of(plain_example_device(), {keys.GPU_PARTITION_POLICY: "Honor"}),
        pod(gpus(1)),
        rs.MISSING_PARTITION_TABLE,
        True,
    ),
    "partition size": (honoured, pod(gpus(5)), rs.UNSUPPORTED_GPU_COUNT, True),
    "partitions taken": (
        lambda: _with_used(honoured(), 0, 4),
        pod(gpus(4)),
        rs.INSUFFICIENT_PARTITIONS,
        False,
    ),
    "no tree": (
        no_topology,
        pod(gpus(2), annotations=hint(gpu={"requiredTopologyScope": "NUMANode"})),
        rs.MISSING_TOPOLOGY_TREE,
        True,
    ),
    "multi shared": (
        example,
        pod(
            {"koordinator.sh/gpu.shared": "2", "koordinator.sh/gpu-memory-ratio": "100"},
            annotations=hint(gpu={"requiredTopologyScope": "Node"}),
        ),
        rs.UNSUPPORTED_MULTI_SHARED,
        True,
    ),
    "scope": (
        busy,
        pod(gpus(2), annotations=hint(gpu={"requiredTopologyScope": "PCIe"})),
        rs.INSUFFICIENT_SCOPED,
        False,
    ),
    "no Device": (lambda: NodeState("bare"), pod(gpus(1)), rs.NO_DEVICE_CR, True),
}


def _with_used(state: NodeState, *minors: int) -> NodeState:
    use_gpus(state, *minors)
    return state


@pytest.mark.parametrize("name", sorted(CASES))
def test_reason_codes_and_resolvability(name: str) -> None:
    make_state, p, code, unresolvable = CASES[name]
    state = make_state()
    req = pod_request(p)
    got = allocate(state, req)
    assert isinstance(got, Rejection), got
    assert got.code.startswith(code), got.code
    assert got.unresolvable is unresolvable
    assert got.message and len(got.message) < 200 and "\n" not in got.message
    assert fits(state, req) == got


def test_messages_name_neither_pod_nor_node() -> None:
    """Two nodes in the same state give one reason text, whatever the pod and node are called."""
    texts = set()
    for node, name in (("node-a", "pod-1"), ("node-b", "pod-2")):
        dev = plain_example_device()
        dev["metadata"]["name"] = node
        state = state_of(dev, name=node)
        use_gpus(state, 0, 1, 2, 3, 4)
        got = allocate(state, pod_request(pod(gpus(4), name=name)))
        assert isinstance(got, Rejection)
        assert node not in got.message and name not in got.message
        texts.add(got.message)
    assert texts == {"need 4 free GPUs"}


def test_rejection_is_small_and_hashable() -> None:
    r = Rejection("code", "message", True)
    assert str(r) == "message" and hash(r) == hash(Rejection("code", "message", True))
    assert json.dumps({"reason": str(r)}) == '{"reason": "message"}'


@pytest.mark.parametrize(
    ("request_", "used"),
    [
        (pod(gpus(4)), ((0, 1, 2, 3, 4), (0, 1, 2, 3, 4, 5), (0, 1, 2, 3, 4, 5, 6))),
        (
            pod(gpus(2), annotations=hint(gpu={"requiredTopologyScope": "PCIe"})),
            ((0, 2, 4, 6), (0, 1, 2, 3, 4, 5, 6), tuple(range(8))),
        ),
    ],
)
def test_nodes_short_by_different_amounts_give_one_message(request_: dict[str, Any], used: tuple) -> None:
    """kube-scheduler counts nodes per failure message: what each node has left (free counts, the
    best switch) stays out of it and goes to `detail`, so one shortage is one reason."""
    messages, details = set(), set()
    req = pod_request(request_)
    for i, minors in enumerate(used):
        state = state_of(plain_example_device(), name=f"n{i}")
        use_gpus(state, *minors, share=50)
        got = allocate(state, req)
        assert isinstance(got, Rejection), got
        messages.add(got.message)
        details.add(got.detail)
        assert got.explained == f"{got.message}; {got.detail}"
    assert len(messages) == 1 and len(details) > 1
