"""The node's DRA pool built from the Device of every hw-fixture: names the API accepts, the API's
limits, attributes that align a GPU with the NIC behind its switch, unhealthy devices tainted (or
left out where the server drops taints)."""

from __future__ import annotations

import copy
import re
from dataclasses import replace
from typing import Any

import pytest

from agent.config import AgentConfig
from agent.dra.slices import (
    DEFAULT_MAX_VFS_PER_NIC,
    MAX_DEVICES_WITH_TAINTS,
    partition_ids,
    pool_devices,
    pool_slices,
    untainted,
    whole,
)
from agent.main_loop import PassResult
from apis import dra
from apis.device import VirtualFunction, VirtualFunctionGroup
from apis.dra_taints import NO_EXECUTE, NO_SCHEDULE, UNHEALTHY_KEY
from apis.partitions import parse_gpu_partitions
from tests.agent.support import FIXTURE_NAMES, FIXTURES, one_pass

# k8s.io/apimachinery: a C identifier of at most 32 characters, or <DNS subdomain>/<C identifier>
C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}")
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def qualified_name_ok(name: str) -> bool:
    if "/" not in name:
        return C_IDENTIFIER.fullmatch(name) is not None
    domain, ident = name.split("/", 1)
    return (
        len(domain) <= 63
        and DNS_SUBDOMAIN.fullmatch(domain) is not None
        and C_IDENTIFIER.fullmatch(ident) is not None
    )


def dra_pass(fixture: str) -> PassResult:
    return one_pass(FIXTURES / fixture, config=AgentConfig(mode=dra.MODE_DRA))


def by_name(devices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for d in devices}


def value(dev: dict[str, Any], attr: str) -> Any:
    (v,) = dev["attributes"][attr].values()
    return v


@pytest.mark.parametrize("fixture", FIXTURE_NAMES)
def test_every_fixture_gives_a_pool_the_api_accepts(fixture: str) -> None:
    result = dra_pass(fixture)
    devices = result.pool
    healthy = [d for d in result.device.devices if d.health]
    assert len([d for d in devices if value(d, "type") != dra.TYPE_RDMA_VF]) == len(result.device.devices)
    assert len([d for d in untainted(devices) if value(d, "type") != dra.TYPE_RDMA_VF]) == len(healthy)
    for dev in devices:
        assert DNS_LABEL.fullmatch(dev["name"]) and dra.parse_device_name(dev["name"]) is not None
        assert len(dev["attributes"]) + len(dev.get("capacity", {})) <= dra.MAX_ATTRIBUTES_PER_DEVICE
        for name, val in dev["attributes"].items():
            assert qualified_name_ok(name), name
            assert len(val) == 1  # exactly one of int, bool, string, version
            if "string" in val:
                assert len(val["string"]) <= 64
        for name, cap in dev.get("capacity", {}).items():
            assert qualified_name_ok(name), name
            assert set(cap) <= {"value", "requestPolicy"} and "value" in cap
            if "requestPolicy" in cap:  # only on a device that allows several allocations
                assert dev[dra.ALLOW_MULTIPLE] is True and cap["requestPolicy"]["default"] == cap["value"]
    for piece in pool_slices(fixture, devices, 1):
        tainted = any(d.get("taints") for d in piece["spec"]["devices"])
        limit = MAX_DEVICES_WITH_TAINTS if tainted else dra.MAX_DEVICES_PER_SLICE
        assert len(piece["spec"]["devices"]) <= limit
        assert DNS_SUBDOMAIN.fullmatch(piece["metadata"]["name"])
        for dev in piece["spec"]["devices"]:
            for taint in dev.get("taints", ()):  # a label value: what the API accepts
                assert re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", taint["value"])


def test_gpu_and_the_nic_behind_its_switch_share_their_place_on_dgx_h100() -> None:
    result = dra_pass("dgx-h100")
    devices = by_name(result.pool)
    gpu0, nic0, vf = devices["gpu-0"], devices["rdma-0"], devices["rdma-0-vf-0"]
    shared = (dra.ATTR_PCIE_SWITCH, dra.PCIE_ROOT, dra.NUMA_NODE, dra.ATTR_SOCKET)
    assert (
        [value(gpu0, a) for a in shared] == [value(nic0, a) for a in shared] == [value(vf, a) for a in shared]
    )
    assert value(gpu0, dra.ATTR_PCIE_SWITCH) == "0000:16:00.0"
    assert value(gpu0, dra.PCIE_ROOT) == "pci0000:15"
    # ...and a GPU behind another switch does not
    assert value(devices["gpu-1"], dra.ATTR_PCIE_SWITCH) != value(nic0, dra.ATTR_PCIE_SWITCH)
    # the standard and topoalloc's attributes of a GPU
    assert value(gpu0, dra.PCI_BUS_ID) == "0000:1b:00.0"
    assert value(gpu0, dra.ATTR_PRODUCT) == "NVIDIA H100 80GB HBM3"
    assert value(gpu0, dra.ATTR_UUID).startswith("GPU-")
    assert value(gpu0, dra.ATTR_NVLINK_DOMAIN) == "nvlink0"
    assert whole([gpu0])[0]["capacity"] == {dra.CAPACITY_MEMORY: {"value": "81559Mi"}}
    # a VF names its NIC and carries its own address
    assert value(vf, dra.ATTR_PF) == "rdma-0" and value(vf, dra.PCI_BUS_ID) == "0000:18:00.1"
    assert value(nic0, dra.PCI_BUS_ID) == "0000:18:00.0" and value(nic0, dra.ATTR_LINK_LAYER) == "InfiniBand"


def test_nvlink_partition_attributes_follow_the_partition_table() -> None:
    result = dra_pass("dgx-h100")
    table = partition_ids(result.device)
    gpus = [d for d in result.pool if value(d, "type") == dra.TYPE_GPU]
    pairs: dict[int, set[int]] = {}
    for dev in gpus:
        minor = value(dev, dra.ATTR_MINOR)
        assert {k for k in dev["attributes"] if dra.partition_of(k) is not None} == {
            dra.partition_attribute(size) for size in table[minor]
        }
        assert all(nvlink for _, nvlink in table[minor].values())  # an NVSwitch machine
        pairs.setdefault(value(dev, dra.partition_attribute(2)), set()).add(minor)
    # the values group the GPUs exactly as the table's pairs do
    listed = parse_gpu_partitions(result.device.annotations["scheduling.koordinator.sh/gpu-partitions"])
    assert sorted(sorted(p) for p in pairs.values()) == sorted(sorted(p.minors) for p in listed.by_size[2])


def test_a_gpu_in_no_partition_of_a_size_has_no_attribute_of_that_size() -> None:
    result = dra_pass("l20-4x-vm-numa-unknown")
    device = copy.deepcopy(result.device)
    # a table with one pair only: GPUs 2 and 3 belong to no pair (L20s have no NVLink: a PCIe pair)
    device.metadata["annotations"]["scheduling.koordinator.sh/gpu-partitions"] = '{"2":[{"minors":[0,1]}]}'
    devices = by_name(pool_devices(device, max_vfs=8))
    assert value(devices["gpu-0"], "pciePartition2") == value(devices["gpu-1"], "pciePartition2") == 0
    assert not {"pciePartition2", "nvlinkPartition2"} & set(devices["gpu-2"]["attributes"])


@pytest.mark.parametrize("fixture", FIXTURE_NAMES)
def test_an_nvlink_partition_attribute_groups_only_gpus_that_share_nvlink(fixture: str) -> None:
    """On every recorded machine: the GPUs sharing a value of `nvlinkPartition<N>` share one NVLink
    domain in the Device; a partition whose GPUs do not (a PCIe ring) is `pciePartition<N>`."""
    result = dra_pass(fixture)
    domain = {d.minor: d.nvlink.domain if d.nvlink else "" for d in result.device.devices if d.type == "gpu"}
    groups: dict[tuple[str, int], set[int]] = {}
    for dev in result.pool:
        for name, val in dev["attributes"].items():
            if dra.partition_of(name) is not None:
                groups.setdefault((name, next(iter(val.values()))), set()).add(value(dev, dra.ATTR_MINOR))
    for (name, _), minors in groups.items():
        _, nvlink = dra.partition_of(name) or (0, False)
        if nvlink:
            assert len({domain[m] for m in minors}) == 1 and domain[min(minors)], (name, minors)
    if not any(domain.values()):  # no NVLink at all (the L40S, the L20s, the PCIe A100s)
        assert not [k for k, _ in groups if k.startswith(dra.PARTITION_PREFIX)], fixture


def test_a_pcie_machine_publishes_its_partition_table_under_pcie_names() -> None:
    devices = by_name(dra_pass("l40s-8x-pcie").pool)
    gpu0 = devices["gpu-0"]["attributes"]
    assert {k for k in gpu0 if dra.partition_of(k)} == {f"pciePartition{n}" for n in (1, 2, 4, 8)}
    assert value(devices["gpu-0"], "pciePartition2") == value(devices["gpu-1"], "pciePartition2")


def test_a_table_that_says_nvlink_for_cards_without_it_is_published_as_pcie() -> None:
    """A table written by hand (a config rule) may claim NVLink: the Device's NVLink facts decide."""
    result = dra_pass("l40s-8x-pcie")
    device = copy.deepcopy(result.device)
    device.metadata["annotations"]["scheduling.koordinator.sh/gpu-partitions"] = (
        '{"2":[{"minors":[0,1],"gpuLinkType":"NVLink"}]}'
    )
    devices = by_name(pool_devices(device, max_vfs=8))
    assert "nvlinkPartition2" not in devices["gpu-0"]["attributes"]
    assert value(devices["gpu-0"], "pciePartition2") == 0


def test_unknown_numa_and_socket_are_left_out_not_guessed() -> None:
    devices = dra_pass("l20-4x-vm-numa-unknown").pool
    assert devices and all(dra.NUMA_NODE not in d["attributes"] for d in devices)
    assert all(dra.ATTR_SOCKET not in d["attributes"] for d in devices)


def test_unhealthy_devices_and_their_vfs_are_left_out() -> None:
    result = dra_pass("dgx-h100")
    sick = {f"rdma-{d.minor}" for d in result.device.devices if d.type == "rdma" and not d.health}
    assert sick  # this machine has NICs whose ports are down
    for pool in (untainted(result.pool), pool_devices(result.device, max_vfs=8)):
        names = {d["name"] for d in pool}
        assert not names & sick
        assert not [n for n in names if any(n.startswith(s + "-vf-") for s in sick)]
        assert "rdma-0" in names and "rdma-0-vf-0" in names


@pytest.mark.parametrize("effect", [NO_SCHEDULE, NO_EXECUTE])
def test_unhealthy_devices_and_their_vfs_stay_tainted(effect: str) -> None:
    device = copy.deepcopy(dra_pass("dgx-h100").device)
    nic0 = next(d for d in device.devices if d.type == "rdma" and d.minor == 0)
    nic0.health = False  # a NIC with VFs goes down, beside the NICs whose ports are down
    nic0.conditions = [replace(c, reason="PortDown 1/1") for c in nic0.conditions]
    sick = {d.minor: d for d in device.devices if d.type == "rdma" and not d.health}
    devices = by_name(pool_devices(device, max_vfs=8, taint_effect=effect))
    for minor, info in sick.items():
        cond = info.conditions[0]
        value = cond.reason.replace(" 1/1", "-1-1")  # a label value
        want = [
            {"key": UNHEALTHY_KEY, "effect": effect, "value": value, "timeAdded": cond.last_transition_time}
        ]
        assert cond.reason and cond.last_transition_time and devices[f"rdma-{minor}"]["taints"] == want
        vfs = [d for n, d in devices.items() if n.startswith(f"rdma-{minor}-vf-")]
        assert all(d["taints"] == want for d in vfs)
    assert [n for n in devices if n.startswith("rdma-0-vf-")]
    assert not any("taints" in d for n, d in devices.items() if n in ("gpu-0", "rdma-4", "rdma-4-vf-0"))
    slices = pool_slices("n", list(devices.values()) * 2, 1)  # a slice with taints: at most 64
    assert [len(s["spec"]["devices"]) for s in slices] == [64, 2 * len(devices) - 64]


def test_vfs_per_nic_are_bounded_and_a_big_pool_is_split_into_slices() -> None:
    device = copy.deepcopy(dra_pass("dgx-h100").device)
    for nic in (d for d in device.devices if d.type == "rdma"):
        nic.health = True
        nic.vf_groups = [
            VirtualFunctionGroup(
                {}, [VirtualFunction(-1, f"0000:{nic.minor + 1:02x}:{i // 8:02x}.{i % 8}") for i in range(40)]
            )
        ]
    devices = pool_devices(device, max_vfs=DEFAULT_MAX_VFS_PER_NIC)
    assert len([d for d in devices if value(d, "type") == dra.TYPE_RDMA_VF]) == 12 * DEFAULT_MAX_VFS_PER_NIC
    many = pool_devices(device, max_vfs=30)
    assert len(many) == 8 + 12 + 12 * 30
    slices = pool_slices("n", many, 7, node_uid="uid-1")
    assert [len(s["spec"]["devices"]) for s in slices] == [128, 128, 124]
    assert {(s["spec"]["pool"]["generation"], s["spec"]["pool"]["resourceSliceCount"]) for s in slices} == {
        (7, 3)
    }
    assert [d["name"] for s in slices for d in s["spec"]["devices"]] == [d["name"] for d in many]
    assert len({s["metadata"]["name"] for s in slices}) == 3
    assert slices[0]["metadata"]["ownerReferences"][0]["uid"] == "uid-1"


def test_device_mode_label_and_no_device_resources_in_dra_mode() -> None:
    result = dra_pass("dgx-h100")
    assert result.labels[dra.MODE_LABEL] == "dra"
    assert set(result.extended.values()) == {None}  # the devices are claimed through the slices
    plugin_mode = one_pass(FIXTURES / "dgx-h100")
    assert plugin_mode.labels[dra.MODE_LABEL] == "device-plugin" and plugin_mode.pool == []
    assert plugin_mode.extended["koordinator.sh/gpu-core"] == "800"


def test_gpus_are_sharable_with_the_whole_gpu_as_default_and_nics_stay_whole() -> None:
    devices = by_name(dra_pass("dgx-h100").pool)
    gpu0 = devices["gpu-0"]
    assert gpu0[dra.ALLOW_MULTIPLE] is True
    assert gpu0["capacity"] == {
        "memory": {"value": "81559Mi", "requestPolicy": {"default": "81559Mi", "validRange": {"min": "1Mi"}}},
        "cores": {
            "value": "100",
            "requestPolicy": {"default": "100", "validRange": {"min": "1", "max": "100", "step": "1"}},
        },
    }
    for name, dev in devices.items():
        if not name.startswith("gpu-"):  # NICs and VFs are handed out whole
            assert dra.ALLOW_MULTIPLE not in dev and "capacity" not in dev


def test_whole_gpus_where_the_server_keeps_no_consumable_capacity() -> None:
    pool = dra_pass("dgx-h100").pool
    before = copy.deepcopy(pool)
    flat = by_name(whole(pool))
    assert pool == before  # the pool itself is left as it was
    for name, dev in flat.items():
        assert dra.ALLOW_MULTIPLE not in dev
        if name.startswith("gpu-"):
            assert dev["capacity"] == {dra.CAPACITY_MEMORY: {"value": "81559Mi"}}
            assert dev["attributes"] == by_name(pool)[name]["attributes"]
        else:
            assert dev == by_name(pool)[name]
