"""Hypothesis strategies producing valid contract objects."""

from __future__ import annotations

from hypothesis import strategies as st

from apis.annotations import (
    ALLOCATE_STRATEGIES,
    EXCLUSIVE_POLICIES,
    NUMA_EXCLUSIVE,
    NUMA_POLICIES,
    PARTITION_ALLOCATE_POLICIES,
    TOPOLOGY_SCOPES,
    AllocatedVF,
    DeviceAllocateHints,
    DeviceAllocation,
    DeviceAllocations,
    DeviceHint,
    DeviceJointAllocate,
    GPUPartitionSpec,
    NUMATopologySpec,
)
from apis.device import (
    Condition,
    Device,
    DeviceInfo,
    DeviceStatusEntry,
    DeviceTopology,
    NVLinkInfo,
    NVLinkPeer,
    VirtualFunction,
    VirtualFunctionGroup,
)
from apis.partitions import GPUPartition, GPUPartitionTable
from apis.podgroup import PHASES, PodGroup, PodGroupStatus
from apis.quantity import Format, Quantity
from apis.resources import GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO, RDMA
from apis.selector import LabelSelector, Requirement

label_name = st.from_regex(r"[a-z][a-z0-9]{0,8}", fullmatch=True)
label_key = st.one_of(label_name, st.builds(lambda p, n: f"{p}.io/{n}", label_name, label_name))
label_value = st.from_regex(r"([a-z0-9]([a-z0-9._-]{0,10}[a-z0-9])?)?", fullmatch=True)
labels = st.dictionaries(label_key, label_value, max_size=3)
bdf = st.builds(
    lambda b, dev, f: f"0000:{b:02x}:{dev:02x}.{f}",
    st.integers(0, 255),
    st.integers(0, 31),
    st.integers(0, 7),
)
text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)

# Quantities as they can appear on the wire: already in canonical form (a binary value that is no
# multiple of 1024 prints undecorated and re-parses as decimal, exactly as in apimachinery).
quantities = st.builds(
    lambda nanos, fmt: Quantity.parse(str(Quantity(nanos, fmt))),
    st.integers(min_value=0, max_value=10**12).map(lambda v: v * 10**6),
    st.sampled_from(list(Format)),
)
resource_names = st.sampled_from([GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO, RDMA, "example.com/x"])
resource_lists = st.dictionaries(resource_names, quantities, max_size=3)
# What one device may advertise: percentage resources stay within 0..100 (apis.podresources).
_percent = st.integers(0, 100).map(Quantity.of)
device_resource_lists = st.fixed_dictionaries(
    {},
    optional={
        GPU_CORE: _percent,
        GPU_MEMORY_RATIO: _percent,
        RDMA: _percent,
        GPU_MEMORY: quantities,
        "example.com/x": quantities,
    },
)

requirements = st.one_of(
    st.builds(
        Requirement,
        label_key,
        st.sampled_from(["In", "NotIn"]),
        st.lists(label_value, min_size=1, max_size=3).map(tuple),
    ),
    st.builds(Requirement, label_key, st.sampled_from(["Exists", "DoesNotExist"])),
)
selectors = st.builds(LabelSelector, labels, st.lists(requirements, max_size=2).map(tuple))

hints = st.builds(
    DeviceHint,
    st.none() | selectors,
    st.none() | selectors,
    st.sampled_from(("", *ALLOCATE_STRATEGIES)),
    st.sampled_from(("", *TOPOLOGY_SCOPES)),
    st.sampled_from(("", *EXCLUSIVE_POLICIES)),
)
device_types = st.sampled_from(["gpu", "rdma", "fpga"])
hint_maps = st.builds(DeviceAllocateHints, st.dictionaries(device_types, st.none() | hints, max_size=3))
joints = st.builds(DeviceJointAllocate, st.lists(device_types, max_size=3), st.sampled_from(["", "SamePCIe"]))
partition_specs = st.builds(
    GPUPartitionSpec, st.sampled_from(("", *PARTITION_ALLOCATE_POLICIES)), st.none() | quantities
)
numa_specs = st.builds(
    NUMATopologySpec, st.sampled_from(NUMA_POLICIES), st.sampled_from(("", *NUMA_EXCLUSIVE))
)

allocated_vfs = st.builds(AllocatedVF, st.integers(-1, 64), st.sampled_from(["", "0000:1a:00.2"]) | bdf)
allocations = st.builds(
    DeviceAllocation,
    st.integers(0, 2**31 - 1),
    st.none() | resource_lists,
    st.sampled_from(["", "GPU-1a2b", "0000:9c:00.0"]),
    st.lists(allocated_vfs, max_size=2),
    st.sampled_from(["", "npu-template-1"]),
    st.booleans(),
)
device_allocations = st.builds(
    DeviceAllocations, st.dictionaries(device_types, st.lists(allocations, max_size=3), max_size=3)
)

partitions = st.builds(
    GPUPartition,
    st.lists(st.integers(0, 62), min_size=1, max_size=8).map(tuple),
    st.sampled_from(["", "NVLink"]),
    st.none() | quantities,
    st.integers(-5, 5),
)
partition_tables = st.builds(
    GPUPartitionTable, st.dictionaries(st.integers(1, 16), st.lists(partitions, max_size=3), max_size=4)
)

topologies = st.builds(
    DeviceTopology,
    st.integers(-1, 3),
    st.integers(-1, 7),
    st.sampled_from(["pci0000:15", "pci0000:97", ""]),
    st.sampled_from([""]) | bdf,
    st.sampled_from([""]) | bdf,
)
conditions = st.builds(
    Condition,
    st.sampled_from(["Healthy", "topoalloc.io/NVLinkDegraded"]),
    st.sampled_from(Condition.STATUSES),
    st.sampled_from(["XidCriticalError", "Recovered"]),
    text,
    st.sampled_from(["2026-11-22T02:26:20Z"]),
    st.integers(0, 10),
)
nvlinks = st.builds(
    NVLinkInfo,
    st.sampled_from(["0", "nvswitch-0"]),
    st.lists(st.builds(NVLinkPeer, st.integers(0, 7), st.integers(0, 18)), max_size=3),
    st.booleans(),
)
vf_groups = st.builds(
    VirtualFunctionGroup, labels, st.lists(st.builds(VirtualFunction, st.integers(-1, 8), bdf), max_size=3)
)


@st.composite
def devices(draw: st.DrawFn) -> Device:
    infos = []
    for dtype in ("gpu", "rdma"):
        minors = draw(st.lists(st.integers(0, 15), unique=True, max_size=4))
        for minor in minors:
            infos.append(
                DeviceInfo(
                    type=dtype,
                    minor=minor,
                    health=draw(st.booleans()),
                    id=draw(st.sampled_from(["", f"GPU-{minor}", f"0000:{minor:02x}:00.0"])),
                    labels=draw(labels),
                    module_id=draw(st.none() | st.integers(0, 7)),
                    resources=draw(device_resource_lists),
                    topology=draw(st.none() | topologies),
                    vf_groups=draw(st.lists(vf_groups, max_size=2)),
                    conditions=draw(st.lists(conditions, max_size=1)),
                    nvlink=draw(st.none() | nvlinks),
                )
            )
    status = draw(
        st.lists(
            st.builds(
                DeviceStatusEntry,
                device_types,
                st.integers(0, 8),
                st.booleans(),
                st.sampled_from(["", "XidCriticalError"]),
                text,
                st.none() | st.integers(0, 200),
                st.none() | st.integers(0, 100),
                st.none() | quantities,
            ),
            max_size=2,
        )
    )
    meta = {"name": draw(label_name), "labels": draw(labels)}
    return Device(metadata=meta, devices=infos, status_devices=status)


podgroups = st.builds(
    PodGroup,
    st.builds(lambda n: {"name": n, "namespace": "default"}, label_name),
    st.integers(0, 64),
    st.dictionaries(st.sampled_from(["cpu", "memory", "nvidia.com/gpu"]), quantities, max_size=2),
    st.none() | st.integers(0, 3600),
    st.builds(
        PodGroupStatus,
        st.sampled_from(("", *PHASES)),
        st.sampled_from(["", "default/job"]),
        st.integers(0, 8),
        st.integers(0, 8),
        st.integers(0, 8),
        st.integers(0, 8),
        st.sampled_from(["", "2026-11-22T02:26:20Z"]),
    ),
)
