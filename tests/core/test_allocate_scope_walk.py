"""Protocol section 8.3: the scope walk (PCIe, NUMA, NVLink) that picks a pod's GPUs."""

from __future__ import annotations

import json

from allocator.core import reasons as rs
from allocator.core.devices.allocate import allocate
from allocator.core.reasons import Rejection
from allocator.core.request.parse import pod_request
from tests.core.allocating import LEAST, MOST, ok, rejected, run
from tests.core.nodes import (
    CORE,
    H800_MEMORY,
    MEM,
    RATIO,
    plain_example_device,
    state_of,
    use_gpus,
)
from tests.core.pods import gpus, hint, pod
from tests.support.machines import l40s_device

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
