"""Annotation -> per-container expectations, and the choice among kubelet's available IDs."""

from __future__ import annotations

import pytest

from agent.deviceplugin.expectation import ExpectationError, expectations
from agent.deviceplugin.inventory import GpuDev, Inventory, NicDev, unit_id
from tests.agent.deviceplugin.rig import allocated, gpu_entry, pod_doc, rdma_entry

INV = Inventory(
    gpus=[GpuDev(m, f"GPU-{m}", 0, True, 80 << 30) for m in range(4)],
    nics=[NicDev(0, "0000:18:00.0", 0, True, ("0000:18:00.1", "0000:18:00.2"))],
)


def test_gpu_core_shares_on_two_gpus() -> None:
    pod = pod_doc(
        "p", {"c": {"koordinator.sh/gpu-core": "150"}}, allocated([gpu_entry(1), gpu_entry(2, core=50)])
    )
    (exp,) = expectations(pod, "koordinator.sh/gpu-core", INV)
    assert exp.counts == (("GPU-1", 100), ("GPU-2", 50))
    available = [unit_id(f"GPU-{m}", k) for m in range(4) for k in range(100)]
    chosen = exp.choose("koordinator.sh/gpu-core", available, [])
    assert chosen is not None and len(chosen) == 150
    assert exp.accepts("koordinator.sh/gpu-core", chosen)
    assert not exp.accepts("koordinator.sh/gpu-core", [*chosen[:-1], unit_id("GPU-3", 0)])
    assert not exp.accepts("koordinator.sh/gpu-core", [*chosen[:-1], chosen[0]])  # a duplicate
    # GPU 2 has only 40 units left at kubelet: the pod cannot be had
    short = [i for i in available if not i.startswith("GPU-2-u") or int(i[-2:]) < 40]
    assert exp.choose("koordinator.sh/gpu-core", short, []) is None


def test_must_include_outside_the_annotation_is_not_satisfiable() -> None:
    pod = pod_doc("p", {"c": {"nvidia.com/gpu": "1"}}, allocated([gpu_entry(1)]))
    (exp,) = expectations(pod, "nvidia.com/gpu", INV)
    assert exp.choose("nvidia.com/gpu", ["GPU-0", "GPU-1"], ["GPU-0"]) is None
    assert exp.choose("nvidia.com/gpu", ["GPU-0", "GPU-1"], ["GPU-1"]) == ["GPU-1"]


def test_rdma_units_spread_over_the_annotated_nic() -> None:
    pod = pod_doc(
        "p",
        {"c": {"koordinator.sh/rdma": "1"}},
        allocated(rdma=[rdma_entry(0, "0000:18:00.0", "0000:18:00.2")]),
    )
    (exp,) = expectations(pod, "koordinator.sh/rdma", INV)
    assert exp.counts == (("0000:18:00.0", 1),)


@pytest.mark.parametrize(
    ("containers", "reason"),
    [
        (
            {"a": {"nvidia.com/gpu": "1"}, "b": {"nvidia.com/gpu": "1"}},
            "the pod requests 2, the annotation allocates 1",
        ),
        (
            {"a": {"nvidia.com/gpu": "1.5"}},
            r"container 'a' nvidia\.com/gpu: must be a whole number: nvidia\.com/gpu is an extended resource",
        ),
        ({"a": {"nvidia.com/gpu": "-1"}}, r"container 'a' nvidia\.com/gpu: must not be negative"),
        ({"a": {"nvidia.com/gpu": "x1"}}, r"^container 'a' nvidia\.com/gpu: not a valid quantity"),
    ],
)
def test_requests_that_do_not_add_up(containers, reason) -> None:
    pod = pod_doc("p", containers, allocated([gpu_entry(1)]))
    with pytest.raises(ExpectationError, match=reason):
        expectations(pod, "nvidia.com/gpu", INV)


def test_split_that_crosses_an_entry_is_refused() -> None:
    pod = pod_doc(
        "p",
        {"a": {"koordinator.sh/gpu-core": "50"}, "b": {"koordinator.sh/gpu-core": "100"}},
        allocated([gpu_entry(1), gpu_entry(2, core=50)]),
    )
    with pytest.raises(
        ExpectationError, match=r"container 'a' requests 50, the annotation entries split as \[100, 50\]"
    ):
        expectations(pod, "koordinator.sh/gpu-core", INV)


def test_init_container_device_request_is_refused() -> None:
    pod = pod_doc("p", {"a": {"nvidia.com/gpu": "1"}}, allocated([gpu_entry(1)]))
    pod["spec"]["initContainers"] = [{"name": "warm", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    with pytest.raises(ExpectationError, match=r"init container 'warm' requests nvidia\.com/gpu"):
        expectations(pod, "nvidia.com/gpu", INV)
