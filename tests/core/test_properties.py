"""Properties over random Device CRs, random existing allocations and random requests.

* never an unhealthy device, never beyond what is free, never a VF already taken;
* never outside a required topology scope, never a SamePCIe mismatch;
* the same input gives the same output;
* whatever allocate returns passes fits, and fits rejects exactly as allocate does;
* malformed pods never raise.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocator.core.devices.allocate import Allocation, allocate, fits
from allocator.core.node.inventory import SCOPE_LEVELS, build_inventory
from allocator.core.node.state import NodeState
from allocator.core.reasons import Rejection
from allocator.core.request.parse import pod_request
from allocator.core.request.pod_request import PodRequest
from allocator.core.scoring.device import DeviceScoring
from apis import keys
from apis.annotations import AllocatedVF, DeviceAllocation, DeviceAllocations
from apis.quantity import Format, Quantity

PROPS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CORE, MEM, RATIO, RDMA = (
    "koordinator.sh/gpu-core",
    "koordinator.sh/gpu-memory",
    "koordinator.sh/gpu-memory-ratio",
    "koordinator.sh/rdma",
)
GI = 2**30
ROOTS = ("pci0000:15", "pci0000:37", "pci0000:97")
SWITCHES = ("0000:16:00.0", "0000:38:00.0", "0000:98:00.0", "0000:99:00.0")


@st.composite
def devices(draw: st.DrawFn, *, focus_partitions: bool = False) -> dict[str, Any]:
    n_gpu = draw(st.integers(4, 8) if focus_partitions else st.integers(0, 8))
    gpu_minors = sorted(draw(st.sets(st.integers(0, 9), min_size=n_gpu, max_size=n_gpu)))
    with_topology = draw(st.booleans()) or draw(st.booleans())
    use_switch = draw(st.booleans())
    memory = draw(st.sampled_from((16 * GI, 80 * GI)))
    domains = draw(st.sampled_from(((), ("a",), ("a", "b"))))
    items: list[dict[str, Any]] = []

    structured = draw(st.integers(0, 2)) > 0  # most nodes: GPU pairs per switch, four per NUMA node

    def topology(numa: int, index: int) -> dict[str, Any]:
        if structured:
            root = ROOTS[index // 2 % len(ROOTS)]
            switch = SWITCHES[index // 2 % len(SWITCHES)]
        else:
            root, switch = draw(st.sampled_from(ROOTS)), draw(st.sampled_from(SWITCHES))
        topo = {"socketID": max(numa, 0), "nodeID": numa, "pcieID": root, "busID": "0000:00:00.0"}
        if use_switch:
            topo["pcieSwitchID"] = switch
        return topo

    pair_links: dict[tuple[int, int], int] = {}
    if domains and draw(st.booleans()):
        for i, a in enumerate(gpu_minors):
            for b in gpu_minors[i + 1 :]:
                pair_links[(a, b)] = draw(st.integers(0, 2))
    for index, minor in enumerate(gpu_minors):
        dev: dict[str, Any] = {
            "type": "gpu",
            "id": f"GPU-{minor}",
            "minor": minor,
            "health": draw(st.integers(0, 9)) > 0,
            "labels": {"pool": draw(st.sampled_from(("a", "b")))},
            "resources": {CORE: "100", RATIO: "100", MEM: str(memory)},
        }
        if with_topology:
            numa = index // 4 if structured and draw(st.integers(0, 5)) else draw(st.sampled_from((0, 1, -1)))
            dev["topology"] = topology(numa, index)
        if domains:
            dev["nvlink"] = {
                "domain": domains[index * len(domains) // 8] if structured else draw(st.sampled_from(domains))
            }
            peers = sorted(
                (b if a == minor else a, n) for (a, b), n in pair_links.items() if minor in (a, b) and n
            )
            if peers:  # NVLink counts per peer: where they differ the set chooser decides
                dev["nvlink"]["peers"] = [{"minor": p, "links": n} for p, n in peers]
        items.append(dev)
    for minor in range(draw(st.sampled_from((0, 2, 3, 4)))):
        nic: dict[str, Any] = {
            "type": "rdma",
            "id": f"0000:{minor:02x}:00.0",
            "minor": minor,
            "health": draw(st.integers(0, 9)) > 0,
            "resources": {RDMA: "100"},
            "topology": topology(minor // 2, minor * 2),
        }
        n_vf = draw(st.integers(0, 3))
        if n_vf:
            labels = draw(st.sampled_from(({}, {"type": "general"})))
            nic["vfGroups"] = [
                {
                    "labels": labels,
                    "vfs": [{"minor": -1, "busID": f"0000:{minor:02x}:00.{f + 2}"} for f in range(n_vf)],
                }
            ]
        items.append(nic)
    labels: dict[str, str] = {
        keys.GPU_VENDOR: "nvidia",
        keys.GPU_MODEL: draw(st.sampled_from(("H100", "L40S"))),
    }
    if focus_partitions or draw(st.booleans()):
        labels[keys.GPU_PARTITION_POLICY] = draw(st.sampled_from(("Honor", "Honor", "Prefer")))
    annotations = {}
    if gpu_minors and (focus_partitions or draw(st.booleans())):
        table: dict[str, list[dict[str, Any]]] = {}
        for size in (1, 2, 4):
            parts = []
            for start in range(0, len(gpu_minors) - size + 1, size):
                parts.append(
                    {
                        "minors": gpu_minors[start : start + size],
                        "ringBusBandwidth": draw(st.sampled_from(("100Gi", "200Gi", "300Gi"))),
                        "allocationScore": draw(st.integers(0, 2)),
                    }
                )
            if parts:
                table[str(size)] = parts
        annotations[keys.GPU_PARTITIONS] = json.dumps(table)
    return {
        "metadata": {"name": "n", "labels": labels, "annotations": annotations},
        "spec": {"devices": items},
    }


@st.composite
def states(draw: st.DrawFn, *, focus_partitions: bool = False) -> tuple[NodeState, dict[str, Any]]:
    device = draw(devices(focus_partitions=focus_partitions))
    inv = build_inventory(device)
    node_labels = dict(inv.labels)
    if draw(st.booleans()):
        node_labels[keys.GPU_ISOLATION_PROVIDER] = keys.HAMI_CORE
    state = NodeState("n", inv, node_labels)
    for slot in inv.slots("gpu"):
        share = draw(st.sampled_from((0, 0, 0, 25, 50, 70, 100)))
        if share:
            mem = slot.total.get(MEM, 16 * GI) * share // 100
            res = {
                CORE: Quantity.of(share),
                RATIO: Quantity.of(share),
                MEM: Quantity.of(mem, Format.BINARY_SI),
            }
            state.add_pod(
                f"ns/g{slot.minor}", DeviceAllocations({"gpu": [DeviceAllocation(slot.minor, res)]})
            )
    for slot in inv.slots("rdma"):
        for vf in slot.vfs:
            if draw(st.integers(0, 2)) == 0:
                entry = DeviceAllocation(slot.minor, {RDMA: Quantity.of(1)}, vfs=[AllocatedVF(-1, vf.bus_id)])
                state.add_pod(f"ns/{vf.bus_id}", DeviceAllocations({"rdma": [entry]}))
    return state, device


GPU_REQUESTS = (
    {"nvidia.com/gpu": "1"},
    {"nvidia.com/gpu": "2"},
    {"nvidia.com/gpu": "3"},
    {"nvidia.com/gpu": "4"},
    {"nvidia.com/gpu": "8"},
    {"koordinator.sh/gpu": "30"},
    {"koordinator.sh/gpu": "50"},
    {"koordinator.sh/gpu": "200"},
    {MEM: "8Gi"},
    {"koordinator.sh/gpu.shared": "2", CORE: "100", RATIO: "100"},
)
RDMA_REQUESTS = ({RDMA: "1"}, {RDMA: "100"}, {RDMA: "200"}, {RDMA: "2"})


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    """Four kinds, equally likely: GPUs without hints (the fast path), GPUs with hints and
    partition specs, RDMA alone, and GPUs with RDMA (often joint)."""
    kind = draw(st.sampled_from(("plain-gpu", "gpu", "rdma", "gpu+rdma")))
    requests: dict[str, str] = {}
    if kind != "rdma":
        requests.update(draw(st.sampled_from(GPU_REQUESTS)))
    if kind in ("rdma", "gpu+rdma"):
        requests.update(draw(st.sampled_from(RDMA_REQUESTS)))
    annotations: dict[str, str] = {}
    labels = {keys.GPU_ISOLATION_PROVIDER: keys.HAMI_CORE} if draw(st.integers(0, 4)) == 0 else {}
    if kind == "plain-gpu":
        return _pod(requests, annotations, labels)
    hints: dict[str, Any] = {}
    gpu_hint: dict[str, Any] = {}
    if kind != "rdma" and draw(st.booleans()):
        gpu_hint["requiredTopologyScope"] = draw(st.sampled_from(tuple(SCOPE_LEVELS)))
    if kind != "rdma" and draw(st.integers(0, 3)) == 0:
        gpu_hint["selector"] = {"matchLabels": {"pool": "a"}}
    if kind != "rdma" and draw(st.integers(0, 3)) == 0:
        gpu_hint["exclusivePolicy"] = "PCIeLevel"
    if gpu_hint:
        hints["gpu"] = gpu_hint
    rdma_hint: dict[str, Any] = {}
    if kind != "gpu" and draw(st.booleans()):
        rdma_hint["vfSelector"] = draw(st.sampled_from(({}, {"matchLabels": {"type": "general"}})))
    if kind != "gpu" and draw(st.integers(0, 3)) == 0:
        rdma_hint["allocateStrategy"] = draw(st.sampled_from(("ApplyForAll", "RequestsAsCount")))
    if rdma_hint:
        hints["rdma"] = rdma_hint
    if hints:
        annotations[keys.DEVICE_ALLOCATE_HINT] = json.dumps(hints)
    if kind == "gpu+rdma" and draw(st.integers(0, 3)) > 0:
        joint = {"deviceTypes": draw(st.sampled_from((["gpu", "rdma"], ["rdma", "gpu"])))}
        if draw(st.booleans()):
            joint["requiredScope"] = "SamePCIe"
        annotations[keys.DEVICE_JOINT_ALLOCATE] = json.dumps(joint)
    if kind != "rdma" and draw(st.integers(0, 2)) == 0:
        spec = {"allocatePolicy": draw(st.sampled_from(("Restricted", "BestEffort")))}
        if draw(st.booleans()):
            spec["ringBusBandwidth"] = "200Gi"
        annotations[keys.GPU_PARTITION_SPEC] = json.dumps(spec)
    return _pod(requests, annotations, labels)


def _pod(requests: dict[str, str], annotations: dict[str, str], labels: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "annotations": annotations, "labels": labels},
        "spec": {"containers": [{"resources": {"requests": requests, "limits": requests}}]},
    }


SCORINGS = st.sampled_from((None, DeviceScoring("LeastAllocated"), DeviceScoring("MostAllocated")))


def check_allocation(state: NodeState, req: PodRequest, got: Allocation) -> None:
    inv = state.inventory
    assert inv is not None
    for dtype, entries in got.devices.by_type.items():
        minors = [e.minor for e in entries]
        assert len(minors) == len(set(minors)), f"{dtype} chosen twice"
        request = req.gpu.per_gpu_map if dtype == "gpu" and req.gpu is not None else None
        for e in entries:
            slot = inv.slot(dtype, e.minor)
            assert slot is not None and slot.health and slot.total, f"unhealthy {dtype} {e.minor}"
            assert e.id == slot.id
            free = state.free[dtype][e.minor]
            asked = request if request is not None else {n: q.value() for n, q in (e.resources or {}).items()}
            for name, value in asked.items():
                if name in free:
                    assert value <= free[name], f"{dtype} {e.minor}: {name} {value} > free {free[name]}"
            taken = state.vf_taken.get(dtype, {}).get(e.minor, set())
            for vf in e.vfs:
                assert vf.bus_id in {v.bus_id for v in slot.vfs} and vf.bus_id not in taken
    g = req.gpu
    gpu_minors = got.minors("gpu")
    if g is not None and gpu_minors:
        assert len(gpu_minors) == g.count
        level = g.scope_level
        if level == SCOPE_LEVELS["Device"]:
            assert len(gpu_minors) == 1
        elif level:
            assert inv.tree is not None
            mask = sum(1 << m for m in gpu_minors)
            scopes = [s for lvl, ss in inv.scopes_by_level.items() if lvl >= level for s in ss]
            assert any(mask & ~s.mask == 0 for s in scopes), (
                f"GPUs {gpu_minors} break scope {g.required_scope}"
            )
    if req.joint_same_pcie and len(req.joint_types) > 1 and all(got.minors(t) for t in req.joint_types):
        sets = []
        for dtype in req.joint_types:
            slots = [inv.slot(dtype, m) for m in got.minors(dtype)]
            sets.append({s.pcie_scope for s in slots if s is not None and s.has_topology})
        assert all(s == sets[0] for s in sets), f"SamePCIe broken: {sets}"


@PROPS
@given(states(), pods(), SCORINGS)
def test_allocations_are_safe_and_deterministic(
    node: tuple[NodeState, dict[str, Any]], p: dict[str, Any], scoring: DeviceScoring | None
) -> None:
    state, device = node
    req = pod_request(p)
    got = allocate(state, req, scoring=scoring)
    again = allocate(state, pod_request(copy.deepcopy(p)), scoring=scoring)
    twin = NodeState("n", build_inventory(copy.deepcopy(device)), state.labels)
    for key, entry in state.pods.items():
        twin.add_pod(key, entry.allocations)
    other = allocate(twin, req, scoring=scoring)
    if isinstance(got, Rejection):
        assert got == again == other
        assert got.message and got.code
        return
    assert isinstance(again, Allocation) and isinstance(other, Allocation)
    assert got.to_json() == again.to_json() == other.to_json()
    check_allocation(state, req, got)


SCOPED_PODS = st.builds(
    lambda n, scope, spec: _pod(
        {"nvidia.com/gpu": str(n)},
        {
            keys.DEVICE_ALLOCATE_HINT: json.dumps({"gpu": {"requiredTopologyScope": scope}}),
            **({keys.GPU_PARTITION_SPEC: json.dumps({"allocatePolicy": spec})} if spec else {}),
        },
        {},
    ),
    st.sampled_from((1, 2, 3, 4)),
    st.sampled_from(("PCIe", "NUMANode", "Node")),
    st.sampled_from((None, "Restricted", "BestEffort")),
)


@PROPS
@given(states(focus_partitions=True), SCOPED_PODS, SCORINGS)
def test_required_scopes_hold_on_partitioned_nodes(
    node: tuple[NodeState, dict[str, Any]], p: dict[str, Any], scoring: DeviceScoring | None
) -> None:
    state, _ = node
    req = pod_request(p)
    got = allocate(state, req, scoring=scoring)
    if isinstance(got, Allocation):
        check_allocation(state, req, got)
    assert fits(state, req) == (got if isinstance(got, Rejection) else None)


JOINT_PODS = st.builds(
    lambda n, rdma, vf, primary: _pod(
        {"nvidia.com/gpu": str(n), RDMA: rdma},
        {
            keys.DEVICE_JOINT_ALLOCATE: json.dumps({"deviceTypes": primary, "requiredScope": "SamePCIe"}),
            **({keys.DEVICE_ALLOCATE_HINT: json.dumps({"rdma": {"vfSelector": {}}})} if vf else {}),
        },
        {},
    ),
    st.sampled_from((1, 2, 3, 4)),
    st.sampled_from(("1", "100", "200")),
    st.booleans(),
    st.sampled_from((["gpu", "rdma"], ["rdma", "gpu"])),
)


@PROPS
@given(states(), JOINT_PODS, SCORINGS)
def test_same_pcie_holds_for_joint_pods(
    node: tuple[NodeState, dict[str, Any]], p: dict[str, Any], scoring: DeviceScoring | None
) -> None:
    state, _ = node
    req = pod_request(p)
    got = allocate(state, req, scoring=scoring)
    if isinstance(got, Allocation):
        check_allocation(state, req, got)
    unscored = allocate(state, req)
    assert fits(state, req) == (unscored if isinstance(unscored, Rejection) else None)


@PROPS
@given(states(), pods())
def test_fits_agrees_with_allocate(node: tuple[NodeState, dict[str, Any]], p: dict[str, Any]) -> None:
    state, _ = node
    req = pod_request(p)
    got = allocate(state, req)
    verdict = fits(state, req)
    if isinstance(got, Allocation):
        assert verdict is None, verdict
    else:
        assert verdict == got


@PROPS
@given(states(), pods())
def test_what_was_allocated_is_then_used(node: tuple[NodeState, dict[str, Any]], p: dict[str, Any]) -> None:
    """Adding the result to the node takes exactly those devices: nothing goes below zero."""
    state, _ = node
    req = pod_request(p)
    got = allocate(state, req, scoring=DeviceScoring("MostAllocated"))
    if not isinstance(got, Allocation) or not got.devices:
        return
    before = copy.deepcopy(state.free)
    state.add_pod("ns/new", got.devices)
    for dtype, entries in got.devices.by_type.items():
        for e in entries:
            asked = req.gpu.per_gpu_map if dtype == "gpu" and req.gpu is not None else None
            for name, q in (e.resources or {}).items():
                if name in before[dtype][e.minor] and (asked is None or name in asked):
                    assert state.free[dtype][e.minor][name] == before[dtype][e.minor][name] - q.value()
    state.remove_pod("ns/new")
    assert state.free == before


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)


ANNOTATION_KEYS = (
    keys.DEVICE_ALLOCATE_HINT,
    keys.DEVICE_JOINT_ALLOCATE,
    keys.GPU_PARTITION_SPEC,
    keys.DEVICE_ALLOCATED,
    keys.NUMA_TOPOLOGY_SPEC,
)
GARBAGE_METADATA = st.fixed_dictionaries(
    {},
    optional={
        "annotations": st.dictionaries(
            st.sampled_from(ANNOTATION_KEYS), JSON.map(json.dumps) | st.text(max_size=20)
        ),
        "labels": JSON,
    },
)
GARBAGE_SPEC = JSON | st.fixed_dictionaries(
    {"containers": st.lists(st.fixed_dictionaries({"resources": JSON}), max_size=2)},
    optional={"initContainers": JSON, "overhead": JSON, "affinity": JSON, "nodeSelector": JSON},
)


@PROPS
@given(st.fixed_dictionaries({}, optional={"metadata": GARBAGE_METADATA, "spec": GARBAGE_SPEC}), states())
def test_malformed_pods_never_raise(p: dict[str, Any], node: tuple[NodeState, dict[str, Any]]) -> None:
    req = pod_request(p)
    assert req.invalid is None or (req.invalid.unresolvable and req.invalid.message)
    state, _ = node
    result = allocate(state, req)
    assert isinstance(result, Allocation | Rejection)
    assert fits(state, req) == (result if isinstance(result, Rejection) else None)
