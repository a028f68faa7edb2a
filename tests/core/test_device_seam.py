"""The device-type seam holds: the node state and the allocation loop name no device type, and the
per-type node summaries a NodeState keeps device by device equal the ones of a node built afresh.

Device-type knowledge lives behind `devices/handler.py` (one handler per type in
`devices/registry.py`) and, for node summaries, `node/summaries.py` (one summary class per type).
"""

from __future__ import annotations

import ast
import random
import re
from pathlib import Path

import pytest

from allocator.core.devices.allocate import fits_grouping
from allocator.core.devices.handler import DeviceHandler
from allocator.core.devices.registry import HANDLERS
from allocator.core.node.features import FITS_EXACT
from allocator.core.node.gpu_features import FITS_SHARE, FITS_WHOLE
from allocator.core.node.gpu_summary import GPUSummary
from allocator.core.node.inventory import LEVEL_NUMA, LEVEL_PCIE
from allocator.core.node.state import NodeState
from allocator.core.node.summaries import SUMMARIES
from allocator.core.request.parse import pod_request
from allocator.core.request.pod_request import WHOLE_GPU, as_resources
from apis.annotations import DeviceAllocations
from tests.core.nodes import state_of
from tests.core.pods import gpus, hint, pod
from tests.support.allocations import entry
from tests.support.machines import dgx_h100_device, l40s_device

REPO = Path(__file__).resolve().parents[2]
CORE, MEM, RATIO = "koordinator.sh/gpu-core", "koordinator.sh/gpu-memory", "koordinator.sh/gpu-memory-ratio"

# Identifiers that name a device type or what only one type has.
DEVICE_TYPE_NAMES = re.compile(r"gpu|rdma|fpga|devicetype|nvlink|partition|pcie_scopes|isolation", re.I)
TYPE_FREE = {
    "allocator/core/node/state.py": {"whole_gpus_free"},  # compatibility for allocator/gang only
    "allocator/core/devices/allocate.py": set(),
}


def _identifiers(path: Path) -> set[str]:
    """Every name the module binds, reads, imports or passes as a keyword (strings and comments
    are prose and not counted)."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.update(n for n in (node.name, node.asname) if n)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.update(node.module.split("."))
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.arg) or (isinstance(node, ast.keyword) and node.arg):
            names.add(node.arg)
    return names


@pytest.mark.parametrize("module", sorted(TYPE_FREE))
def test_node_state_and_allocate_name_no_device_type(module: str) -> None:
    named = {n for n in _identifiers(REPO / module) if DEVICE_TYPE_NAMES.search(n)}
    assert named == TYPE_FREE[module]


def test_the_check_sees_a_device_type() -> None:
    assert {n for n in _identifiers(REPO / "allocator/core/devices/gpu.py") if DEVICE_TYPE_NAMES.search(n)}


def test_every_handler_implements_the_seam() -> None:
    for dtype, handler in HANDLERS.items():
        assert isinstance(handler, DeviceHandler), dtype
    assert set(SUMMARIES) <= set(HANDLERS)


def test_grouping_comes_from_the_sole_type_handler() -> None:
    assert fits_grouping(pod_request(pod(gpus(2)))) is FITS_WHOLE
    assert fits_grouping(pod_request(pod({CORE: "50", RATIO: "50"}))) is FITS_SHARE
    joint = pod_request(pod({**gpus(1), "koordinator.sh/rdma": "1"}))
    assert fits_grouping(joint) is FITS_EXACT
    hinted = pod(gpus(1), annotations=hint(gpu={"selector": {"matchLabels": {"a": "b"}}}))
    assert fits_grouping(pod_request(hinted)) is FITS_EXACT
    assert fits_grouping(pod_request(pod({}))) is None


def _summary_facts(state: NodeState) -> tuple:
    g = GPUSummary.of(state)
    shapes = [WHOLE_GPU, as_resources({CORE: 30, RATIO: 30}), as_resources({CORE: 60, RATIO: 60})]
    return (
        g.used_mask,
        g.whole_mask,
        g.free_ratio,
        g.total_ratio,
        g.max_share,
        g.free_pct,
        g.whole_free,
        g.healthy_count,
        tuple(g.fit_mask(s) for s in shapes),
        g.largest_free_set(LEVEL_PCIE),
        g.largest_free_set(LEVEL_NUMA),
    )


@pytest.mark.parametrize("device", [dgx_h100_device, l40s_device])
def test_summaries_kept_device_by_device_equal_a_fresh_node(device) -> None:
    rng = random.Random(7)
    live = state_of(device())
    placed: list[str] = []
    for step in range(120):
        if placed and rng.random() < 0.35:
            live.remove_pod(placed.pop(rng.randrange(len(placed))))
        else:
            share = rng.choice((100, 100, 50, 30, 10))
            minors = rng.sample(range(8), 1 if share < 100 else rng.choice((1, 2, 4)))
            res = {CORE: share, RATIO: share, MEM: 1 << 30}
            key = f"ns/p{step}"
            live.add_pod(key, DeviceAllocations({"gpu": [entry(m, res) for m in minors]}))
            placed.append(key)
        _summary_facts(live)  # read (and cache) between changes, as the filter does
        fresh = NodeState(live.name, live.inventory, live.labels)
        for entry_ in live.pods.values():
            fresh.add_usage(entry_)
        assert _summary_facts(live) == _summary_facts(fresh), step
    assert live.whole_gpus_free == GPUSummary.of(live).whole_free


def test_a_node_without_devices_has_an_empty_gpu_summary() -> None:
    g = GPUSummary.of(NodeState("cpu-only"))
    assert (g.used_mask, g.whole_free, g.free_pct, g.max_share, g.healthy_count) == (0, 0, (), -1, 0)


def test_devices_gone_resets_the_summary() -> None:
    state = state_of(dgx_h100_device())
    state.add_pod("ns/a", DeviceAllocations({"gpu": [entry(0, {CORE: 50, RATIO: 50, MEM: 1 << 30})]}))
    state.devices_gone()
    g = GPUSummary.of(state)
    assert (g.whole_free, g.healthy_count, g.max_share, g.free_pct) == (0, 0, -1, (0,) * 8)
    assert g.used_mask == 1  # the pod still holds GPU 0
