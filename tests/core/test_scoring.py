"""Protocol section 6 (device scoring primitives) and the node scorer used by prioritize."""

from __future__ import annotations

import pytest
import yaml

from allocator.core.node.gpu_features import gpu_model
from allocator.core.node.gpu_summary import GPUSummary
from allocator.core.node.state import NodeState
from allocator.core.request.parse import pod_request
from allocator.core.scoring.device import DeviceScoring
from allocator.core.scoring.fit import fit_score
from allocator.core.scoring.scarce import scarce_score
from allocator.core.scoring.scorer import NodeScorer, ScoringConfig
from allocator.core.scoring.topology import CROSS, NUMA, NVLINK, OPENS_DOMAIN, PCIE, topology_score
from tests.core.nodes import CORE, MEM, RATIO, plain_example_device, state_of, use_gpus
from tests.core.pods import gpus, pod
from tests.support.machines import dgx_h100_device, l40s_device

GI = 2**30
WHOLE = {CORE: 100, RATIO: 100}


# -- 6: scoreDevice / scoreNode ----------------------------------------------------------------------


def test_score_of_one_idle_gpu_is_50_both_ways() -> None:
    """Section 7.5's example: ratio counts as full, memory (not requested) as empty."""
    total = free = {CORE: 100, RATIO: 100, MEM: 16 * GI}
    assert DeviceScoring("LeastAllocated").score_device(WHOLE, total, free) == 50
    assert DeviceScoring("MostAllocated").score_device(WHOLE, total, free) == 50
    assert DeviceScoring().score_node(WHOLE, [total], [free]) == 50


@pytest.mark.parametrize(
    ("strategy", "free_ratio", "expected"),
    [
        ("LeastAllocated", 100, 90),
        ("LeastAllocated", 50, 40),
        ("LeastAllocated", 5, 0),  # asks for more than is free: 0
        ("MostAllocated", 100, 10),
        ("MostAllocated", 50, 60),
        ("MostAllocated", 5, 100),  # capped at the capacity
    ],
)
def test_score_device_per_strategy(strategy: str, free_ratio: int, expected: int) -> None:
    scoring = DeviceScoring(strategy, {RATIO: 1})
    assert scoring.score_device({RATIO: 10}, {RATIO: 100}, {RATIO: free_ratio}) == expected


def test_score_device_ignores_absent_totals_and_weights() -> None:
    scoring = DeviceScoring("MostAllocated", {RATIO: 3, MEM: 1, "koordinator.sh/rdma": 1})
    # rdma has no total: ignored; memory fully free and not requested: 0; ratio 60% -> (60*3 + 0) / 4.
    assert scoring.score_device({RATIO: 10}, {RATIO: 100, MEM: 10}, {RATIO: 50, MEM: 10}) == 45
    assert scoring.score_device({RATIO: 10}, {}, {}) == 0
    # free above total (a shrunk device): requested is the whole total.
    assert scoring.score_device({RATIO: 10}, {RATIO: 100}, {RATIO: 120}) == 100
    with pytest.raises(ValueError):
        DeviceScoring("Balanced")


def test_score_node_sums_devices() -> None:
    scoring = DeviceScoring("MostAllocated", {RATIO: 1})
    totals = [{RATIO: 100}, {RATIO: 100}]
    assert scoring.score_node({RATIO: 50}, totals, [{RATIO: 100}, {RATIO: 0}]) == 75


# -- node scorer components ---------------------------------------------------------------------------


def h100(name: str = "h", cpu: int = 224) -> NodeState:
    state = state_of(dgx_h100_device(name))
    state.set_labels(state.labels, {"cpu": cpu * 1000, "memory": 2048 * GI, "pods": 250})
    return state


def test_fit_packs_gpus_and_spreads_cpu() -> None:
    req = pod_request(pod(gpus(1, cpu="8")))
    idle, busy = h100("idle"), h100("busy")
    use_gpus(busy, 0, 1, 2, 3)
    s_idle, s_busy = (fit_score(s, req, ScoringConfig().fit) for s in (idle, busy))
    assert s_idle is not None and s_busy is not None and s_busy > s_idle
    # GPU 100/800 -> 12 and 500/800 -> 62 (MostAllocated); cpu 8/224 -> 96 (LeastAllocated);
    # memory is not requested.
    assert (s_idle, s_busy) == ((12 + 96) / 2, (62 + 96) / 2)
    assert fit_score(idle, pod_request(pod({"example.com/thing": "1"})), ScoringConfig().fit) is None


def test_scarce_resources_keep_cpu_pods_off_gpu_nodes() -> None:
    cpu_node = NodeState("c", None, {}, {"cpu": 64000, "memory": 256 * GI, "pods": 110})
    gpu_node = h100()
    cpu_pod = pod_request(pod({"cpu": "1", "memory": "1Gi"}))
    gpu_pod = pod_request(pod(gpus(1, cpu="1", memory="1Gi")))
    scarce = ("gpu", "rdma", "fpga")
    assert scarce_score(cpu_node, cpu_pod, scarce) == 100
    assert scarce_score(gpu_node, cpu_pod, scarce) == 0  # only gpu and rdma are extra, both scarce
    assert scarce_score(gpu_node, gpu_pod, scarce) == 0  # rdma is still extra and scarce
    assert scarce_score(gpu_node, gpu_pod, ("gpu",)) == 100


def test_topology_tiers() -> None:
    two = pod_request(pod(gpus(2)))
    assert topology_score(h100(), two) == NVLINK
    l40s = state_of(l40s_device())
    assert topology_score(l40s, two) == PCIE
    use_gpus(l40s, 0, 2, 4, 6)
    assert topology_score(l40s, two) == NUMA
    use_gpus(l40s, 3, 5)
    assert topology_score(l40s, two) == CROSS  # 1 and 7: one free GPU per socket
    assert topology_score(l40s, pod_request(pod(gpus(1)))) is None
    assert topology_score(state_of(plain_example_device()), two) == PCIE


def test_scorer_range_weights_and_plugins() -> None:
    req = pod_request(pod(gpus(2, cpu="4", memory="8Gi")))
    state = h100()
    default = NodeScorer()
    assert 0 <= default.score(state, req) <= 10
    only_topology = NodeScorer(ScoringConfig.from_dict({"weights": {"fit": 0, "scarce": 0, "topology": 1}}))
    assert only_topology.score(state, req) == 10
    # an untouched DGX: the pair splits its one NVLink domain, a quarter point off the tier
    assert only_topology.breakdown(state, req) == {"topology": NVLINK - OPENS_DOMAIN}
    started = h100()
    use_gpus(started, 7)
    assert only_topology.breakdown(started, req) == {"topology": NVLINK}
    calls = []

    def fragmentation(s: NodeState, r: object) -> float:
        calls.append(
            (
                GPUSummary.of(s).free_pct,
                s.cpu_free_milli,
                s.memory_free,
                gpu_model(s),
                GPUSummary.of(s).healthy_count,
            )
        )
        return 0.0

    weights = {"fit": 0, "scarce": 0, "topology": 1, "fragmentation": 1}
    plugged = NodeScorer(ScoringConfig.from_dict({"weights": weights}), {"fragmentation": fragmentation})
    assert plugged.score(state, req) == 5
    assert calls == [((100,) * 8, 224000, 2048 * GI, "H100-80GB-HBM3", 8)]
    assert NodeScorer(ScoringConfig.from_dict({"weights": weights})).score(state, req) == 10  # not plugged in


def test_config_from_yaml_round_trip_and_errors() -> None:
    text = """
weights: {fit: 2, scarce: 0, topology: 1, device: 1}
fit:
  cpu: {type: MostAllocated, weight: 1}
  gpu: {type: LeastAllocated, weight: 3}
scarceResources: [gpu]
deviceScoring:
  type: MostAllocated
  resources: [{name: koordinator.sh/gpu-memory-ratio, weight: 2}]
"""
    cfg = ScoringConfig.from_dict(yaml.safe_load(text))
    assert (
        cfg.weights["fit"] == 2
        and cfg.fit["gpu"].type == "LeastAllocated"
        and cfg.scarce_resources == ("gpu",)
    )
    assert cfg.device_scoring.strategy == "MostAllocated" and dict(cfg.device_scoring.weights) == {RATIO: 2}
    assert ScoringConfig.from_dict(cfg.to_dict()) == cfg
    for bad in ({"weights": {"fit": -1}}, {"fit": {"gpu": {"type": "Random"}}}, {"colour": 1}):
        with pytest.raises(ValueError):
            ScoringConfig.from_dict(bad)


def test_device_component_is_koordinators_deviceshare_score() -> None:
    state = state_of(plain_example_device())
    req = pod_request(pod(gpus(1)))
    scorer = NodeScorer(
        ScoringConfig.from_dict({"weights": {"fit": 0, "scarce": 0, "topology": 0, "device": 1}})
    )
    # LeastAllocated over ratio and memory of 8 idle GPUs: ratio 100/800 used -> 87, memory 0 used -> 100.
    assert scorer.breakdown(state, req) == {"device": (87 + 100) // 2}
