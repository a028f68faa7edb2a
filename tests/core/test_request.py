"""Protocol section 3: how a pod's resources and annotations become a PodRequest."""

from __future__ import annotations

import pytest

from allocator.core import reasons as rs
from allocator.core.request.parse import pod_request
from allocator.core.request.usage import pod_usage
from apis import keys
from tests.core.pods import hint, joint, pod

CORE, MEM, RATIO, SHARED = (
    "koordinator.sh/gpu-core",
    "koordinator.sh/gpu-memory",
    "koordinator.sh/gpu-memory-ratio",
    "koordinator.sh/gpu.shared",
)


# -- 3.1 conversion to the internal per-type request ----------------------------------------------


@pytest.mark.parametrize(
    ("requests", "internal"),
    [
        ({"nvidia.com/gpu": "2"}, {CORE: 200, RATIO: 200}),
        ({"amd.com/gpu": "1"}, {CORE: 100, RATIO: 100}),
        ({"koordinator.sh/gpu": "50"}, {CORE: 50, RATIO: 50}),
        ({"koordinator.sh/gpu": "300"}, {CORE: 300, RATIO: 300}),
        ({MEM: "8Gi"}, {MEM: 8 * 2**30}),
        ({RATIO: "30"}, {RATIO: 30}),
        ({CORE: "50", MEM: "10Gi"}, {CORE: 50, MEM: 10 * 2**30}),
        ({CORE: "200", RATIO: "200"}, {CORE: 200, RATIO: 200}),
        ({SHARED: "2", CORE: "100", RATIO: "100"}, {SHARED: 2, CORE: 100, RATIO: 100}),
        ({SHARED: "4", MEM: "160G"}, {SHARED: 4, MEM: 160 * 10**9}),
        ({"koordinator.sh/rdma": "1"}, None),
    ],
)
def test_gpu_conversion(requests: dict[str, str], internal: dict[str, int] | None) -> None:
    req = pod_request(pod(requests))
    assert req.invalid is None
    assert req.device_request("gpu") == (internal or {})


@pytest.mark.parametrize(
    ("requests", "count", "per_gpu", "shared"),
    [
        ({"nvidia.com/gpu": "4"}, 4, {CORE: 100, RATIO: 100}, False),
        ({SHARED: "2", CORE: "100", RATIO: "100"}, 2, {CORE: 50, RATIO: 50}, True),
        ({MEM: "8Gi"}, 1, {MEM: 8 * 2**30}, True),
        ({SHARED: "4", MEM: "160G"}, 4, {MEM: 40 * 10**9}, True),
        ({"koordinator.sh/gpu": "200"}, 2, {CORE: 100, RATIO: 100}, False),
        ({"koordinator.sh/gpu": "50"}, 1, {CORE: 50, RATIO: 50}, True),
        ({CORE: "100", RATIO: "100"}, 1, {CORE: 100, RATIO: 100}, False),
    ],
)
def test_gpu_requirement(requests: dict[str, str], count: int, per_gpu: dict[str, int], shared: bool) -> None:
    """Protocol 3.2, including its four worked examples."""
    g = pod_request(pod(requests)).gpu
    assert g is not None
    assert (g.count, g.per_gpu_map, g.shared) == (count, per_gpu, shared)


@pytest.mark.parametrize(
    ("requests", "code", "message_part"),
    [
        ({"koordinator.sh/gpu": "150"}, "invalid resource unit koordinator.sh/gpu: 150", "multiple of 100"),
        ({"koordinator.sh/rdma": "250"}, "invalid resource unit koordinator.sh/rdma: 250", "at most 100"),
        ({CORE: "50"}, f"invalid resource device requests: [{CORE}]", "unsupported combination"),
        (
            {CORE: "50", MEM: "1Gi", RATIO: "50"},
            f"invalid resource device requests: [{CORE} {MEM} {RATIO}]",
            "",
        ),
        ({RATIO: "150"}, f"invalid resource device requests: [{RATIO}]", ""),
        (
            {SHARED: "3", CORE: "100", RATIO: "90"},
            f"invalid resource device requests: [{CORE} {RATIO} {SHARED}]",
            "",
        ),
        (
            {"nvidia.com/gpu": "1", "amd.com/gpu": "1"},
            "invalid resource device requests: [amd.com/gpu nvidia.com/gpu]",
            "",
        ),
    ],
)
def test_invalid_resources(requests: dict[str, str], code: str, message_part: str) -> None:
    req = pod_request(pod(requests))
    assert req.invalid is not None
    assert req.invalid.unresolvable
    assert req.invalid.code == code
    assert message_part in req.invalid.message


def test_shared_rule_allows_per_gpu_100() -> None:
    req = pod_request(pod({SHARED: "2", CORE: "200", RATIO: "200"}))
    assert req.invalid is None and req.gpu is not None and req.gpu.count == 2 and not req.gpu.shared


def test_rdma_and_fpga_kept_as_given() -> None:
    req = pod_request(pod({"koordinator.sh/rdma": "200", "koordinator.sh/fpga": "50"}))
    assert req.device_types == ("rdma", "fpga")
    assert req.device_request("rdma") == {"koordinator.sh/rdma": 200}


def test_no_device_request_is_not_a_device_pod() -> None:
    req = pod_request(pod({"cpu": "2", "memory": "1Gi"}))
    assert not req.wants_devices and req.invalid is None
    assert (req.cpu_milli, req.memory) == (2000, 2**30)


# -- 3.1 step 1: kube-scheduler's effective requests --------------------------------------------------


def test_init_containers_take_the_max_and_overhead_adds() -> None:
    p = pod(
        containers=[{"cpu": "1", "nvidia.com/gpu": "1"}, {"cpu": "500m"}],
        init=[{"name": "i", "resources": {"requests": {"cpu": "2", "nvidia.com/gpu": "2"}}}],
        overhead={"cpu": "250m", "memory": "100Mi"},
    )
    req = pod_request(p)
    assert req.cpu_milli == 2250
    assert req.memory == 100 * 2**20
    assert req.gpu is not None and req.gpu.count == 2  # the init container needs 2 GPUs at once


def test_sidecar_init_containers_add_to_the_sum() -> None:
    p = pod(
        containers=[{"cpu": "1"}],
        init=[
            {"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}},
            {"name": "setup", "resources": {"requests": {"cpu": "1500m"}}},
        ],
    )
    # Regular sum with the sidecar: 2 cores; the setup container runs beside the sidecar: 2.5 cores.
    assert pod_request(p).cpu_milli == 2500


def test_limits_stand_in_for_missing_requests() -> None:
    p = pod({})
    p["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1", "cpu": "1"}}
    req = pod_request(p)
    assert req.gpu is not None and req.gpu.count == 1 and req.cpu_milli == 1000


def test_nonzero_requests_use_scheduler_defaults() -> None:
    req = pod_request(pod(containers=[{"nvidia.com/gpu": "1"}, {"cpu": "1"}]))
    assert req.cpu_milli == 1000
    assert req.nonzero_cpu_milli == 1100
    assert req.nonzero_memory == 2 * 200 * 2**20


# -- 3.3-3.5 annotations ---------------------------------------------------------------------------


def test_hints_joint_and_partition_spec() -> None:
    ann = {
        **hint(gpu={"requiredTopologyScope": "PCIe"}, rdma={"vfSelector": {}}),
        **joint("gpu", "rdma"),
        keys.GPU_PARTITION_SPEC: {"allocatePolicy": "Restricted", "ringBusBandwidth": "200Gi"},
    }
    req = pod_request(pod({"nvidia.com/gpu": "2", "koordinator.sh/rdma": "1"}, annotations=ann))
    assert req.invalid is None
    assert req.joint_types == ("gpu", "rdma") and req.joint_same_pcie
    g = req.gpu
    assert g is not None
    assert (g.required_scope, g.scope_level, g.honor_partition, g.restricted_partition) == (
        "PCIe",
        3,
        True,
        True,
    )
    assert g.ring_bus_bandwidth == 200 * 2**30 * 10**9


def test_joint_list_is_cleaned() -> None:
    """Types the pod does not request and ApplyForAll types leave the joint list (3.4)."""
    ann = {**hint(rdma={"allocateStrategy": "ApplyForAll"}), **joint("fpga", "rdma", "gpu")}
    req = pod_request(pod({"nvidia.com/gpu": "1", "koordinator.sh/rdma": "1"}, annotations=ann))
    assert req.joint_types == ("gpu",)


@pytest.mark.parametrize(
    ("annotations", "code_prefix", "message_part"),
    [
        (
            {keys.DEVICE_ALLOCATE_HINT: "{not json"},
            "invalid DeviceAllocateHint annotation, err:",
            "invalid JSON",
        ),
        (
            hint(gpu={"selector": {"matchExpressions": [{"key": "a", "operator": "Bogus"}]}}),
            "invalid Selector of DeviceHint, deviceType: gpu, err:",
            "device-allocate-hint annotation: gpu selector",
        ),
        (
            hint(rdma={"vfSelector": {"matchLabels": {"bad key!": "x"}}}),
            "invalid VFSelector of DeviceHint, deviceType: rdma, err:",
            "device-allocate-hint annotation: rdma vfSelector",
        ),
        (
            hint(gpu={"requiredTopologyScope": "Rack"}),
            "invalid DeviceAllocateHint annotation, err:",
            "must be one of",
        ),
        (
            {keys.DEVICE_JOINT_ALLOCATE: "[1]"},
            "invalid DeviceJointAllocate annotation, err:",
            "expected an object",
        ),
        (
            {keys.GPU_PARTITION_SPEC: {"allocatePolicy": "Always"}},
            "invalid GPUPartitionSpec annotation, err:",
            "must be one of",
        ),
        ({keys.DEVICE_ALLOCATED: "{"}, "scheduling.koordinator.sh/device-allocated", "invalid JSON"),
    ],
)
def test_malformed_annotations_become_invalid_requests(
    annotations: dict[str, object], code_prefix: str, message_part: str
) -> None:
    req = pod_request(pod({"nvidia.com/gpu": "1", "koordinator.sh/rdma": "1"}, annotations=annotations))
    assert req.invalid is not None
    assert req.invalid.unresolvable
    assert req.invalid.code.startswith(code_prefix)
    assert message_part in req.invalid.message


def test_hints_on_a_pod_without_devices_are_ignored() -> None:
    req = pod_request(pod({"cpu": "1"}, annotations={keys.DEVICE_ALLOCATE_HINT: "{nope"}))
    assert req.invalid is None and not req.wants_devices


@pytest.mark.parametrize(
    "bad",
    [
        None,
        "pod",
        {"metadata": "x"},
        {"spec": []},
        {"spec": {"containers": "x"}},
        {"spec": {"containers": [{"resources": {"requests": {"cpu": "lots"}}}]}},
        {"spec": {"containers": [{"resources": {"requests": []}}]}},
        {"metadata": {"labels": {"a": 1}}, "spec": {}},
        {"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": 3}}}},
    ],
)
def test_garbage_pods_never_raise(bad: object) -> None:
    req = pod_request(bad)
    assert req.invalid is not None and req.invalid.unresolvable and req.invalid.message


def test_signature_ignores_the_pod_name_but_not_the_shape() -> None:
    a = pod_request(pod({"nvidia.com/gpu": "1"}, name="a"))
    b = pod_request(pod({"nvidia.com/gpu": "1"}, name="b"))
    c = pod_request(pod({"nvidia.com/gpu": "2"}, name="a"))
    assert a.signature == b.signature and hash(a.signature) == hash(b.signature)
    assert a.signature != c.signature


def test_affinity_gang_and_rl_group_are_parsed() -> None:
    p = pod({"nvidia.com/gpu": "1"}, labels={"scheduling.x-k8s.io/pod-group": "job", "rl-job-group": "g1"})
    p["spec"]["nodeSelector"] = {"zone": "a"}
    p["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]}
                ]
            }
        }
    }
    req = pod_request(p)
    assert req.gang is not None and req.gang.name == "job" and req.rl_job_group == "g1"
    assert req.node_selector == {"zone": "a"}
    assert req.affinity_terms is not None and req.affinity_terms[0].expressions == (("gpu", "In", ("h100",)),)


def test_pod_usage_of_bound_pods() -> None:
    allocated = '{"gpu":[{"minor":1,"resources":{"koordinator.sh/gpu-core":"100"}}]}'
    p = pod({"cpu": "1", "nvidia.com/gpu": "1"}, node="n1", annotations={keys.DEVICE_ALLOCATED: allocated})
    u = pod_usage(p)
    assert (u.node, u.cpu_milli, u.allocations.minors("gpu")) == ("n1", 1000, [1])  # type: ignore[union-attr]
    p["status"] = {"phase": "Succeeded"}
    assert pod_usage(p).allocations is None
    p["status"] = {}
    p["metadata"]["annotations"][keys.DEVICE_ALLOCATED] = "{"
    broken = pod_usage(p)
    assert broken.allocations is None and "invalid JSON" in broken.error


def test_pod_usage_ignores_an_allocation_made_for_another_node() -> None:
    allocated = '{"gpu":[{"minor":1,"resources":{"koordinator.sh/gpu-core":"100"}}]}'
    annotations = {keys.DEVICE_ALLOCATED: allocated, keys.ALLOCATED_NODE: "n2"}
    p = pod({"cpu": "1", "nvidia.com/gpu": "1"}, node="n1", annotations=annotations)
    u = pod_usage(p)
    assert u.allocations is None and u.error == "" and u.cpu_milli == 1000
    p["metadata"]["annotations"][keys.ALLOCATED_NODE] = "n1"
    assert pod_usage(p).allocations.minors("gpu") == [1]  # type: ignore[union-attr]
    p["metadata"]["annotations"][keys.ALLOCATED_NODE] = ""  # empty: as absent
    assert pod_usage(p).allocations.minors("gpu") == [1]  # type: ignore[union-attr]


def test_reason_codes_are_koordinator_strings() -> None:
    assert rs.INSUFFICIENT_DEVICES.format(type="gpu") == "Insufficient gpu devices"
