"""The production scorer's fragmentation component: pods as task shapes, the learned mix, settings."""

from __future__ import annotations

import random

import pytest
import yaml

from allocator.core.cluster.state import ClusterState
from allocator.core.devices.allocate import Allocation
from allocator.core.node.gpu_features import gpu_model
from allocator.core.node.gpu_summary import GPUSummary
from allocator.core.node.inventory import build_inventory
from allocator.core.node.state import NodeState
from allocator.core.request.parse import pod_request
from allocator.core.scoring.fragmentation import score_node
from allocator.core.scoring.fragmentation_term import (
    PRESSURE_LEVELS,
    FragmentationSettings,
    FragmentationTerm,
    required_gpu_models,
    task_shape,
)
from allocator.core.scoring.scorer import NodeScorer, ScoringConfig
from allocator.core.scoring.workload_mix import TaskShape, WorkloadMix
from apis import keys
from tests.core.nodes import CORE, MEM, RATIO, use_gpus
from tests.core.pods import gpus, pod
from tests.support.machines import dgx_h100_device, l40s_device


def model_affinity(*terms: list[str]) -> dict:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": keys.GPU_MODEL, "operator": "In", "values": t}]}
                    for t in terms
                ]
            }
        }
    }


def with_spec(p: dict, **spec: object) -> dict:
    p["spec"].update(spec)
    return p


def test_pods_become_task_shapes() -> None:
    assert task_shape(pod_request(pod({"cpu": "3"}))) == TaskShape(3000)
    assert task_shape(pod_request(pod(gpus(4, cpu="16")))) == TaskShape(16_000, 100, 4)
    assert task_shape(pod_request(pod({CORE: "30", RATIO: "30", "cpu": "2"}))) == TaskShape(2000, 30, 1)
    # a share needs both compute and memory: the larger of the two is what must be free
    assert task_shape(pod_request(pod({CORE: "20", RATIO: "50"}))) == TaskShape(0, 50, 1)
    assert task_shape(pod_request(pod({CORE: "50", MEM: "8Gi"}))) is None  # bytes: node-dependent
    assert task_shape(pod_request(pod({"koordinator.sh/gpu.shared": "2", CORE: "100", RATIO: "100"}))) is None
    assert task_shape(pod_request(pod({"nvidia.com/gpu": "1", CORE: "5"}))) is None  # invalid request


def test_gpu_models_from_selector_and_required_affinity() -> None:
    both = with_spec(pod(gpus(1)), affinity=model_affinity(["T4", "A10"], ["V100"]))
    assert required_gpu_models(pod_request(both)) == ("A10", "T4", "V100")
    selected = with_spec(
        pod(gpus(1)), nodeSelector={keys.GPU_MODEL: "T4"}, affinity=model_affinity(["T4", "A10"])
    )
    assert task_shape(pod_request(selected)) == TaskShape(0, 100, 1, ("T4",))
    other_term = model_affinity(["T4"])
    other_term["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"].append(
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    )
    assert required_gpu_models(pod_request(with_spec(pod(gpus(1)), affinity=other_term))) == ()


def test_the_term_is_score_node_on_the_nodes_summaries() -> None:
    state = NodeState("l1", build_inventory(l40s_device("l1")), {}, {"cpu": 32_000, "memory": 2**40})
    use_gpus(state, 0, 1, share=100)
    use_gpus(state, 2, share=60)
    prior = WorkloadMix((TaskShape(2000, 30, 1), TaskShape(8000, 100, 1)), (0.5, 0.5))
    term = FragmentationTerm(
        FragmentationSettings(prior=tuple(zip(prior.shapes, prior.weights, strict=True)))
    )
    req = pod_request(pod({CORE: "30", RATIO: "30", "cpu": "2"}))
    want = score_node((0, 0, 40, 100, 100, 100, 100, 100), 32_000, "L40S", TaskShape(2000, 30, 1), prior)
    assert term.placement(state, req) == want and want is not None and want.gpus == (2,)
    assert term.prepare(req)(state) == want.score
    assert term.preferred_gpus(state, req) == (2,)


def test_the_mix_is_learned_from_the_first_placement_and_the_scorer_refreshes() -> None:
    term = FragmentationTerm(FragmentationSettings(refresh_every=4, tolerance=0.0))
    scorer = NodeScorer(ScoringConfig(), {"fragmentation": term})
    one, half = pod_request(pod(gpus(1, cpu="4"))), pod_request(pod({CORE: "50", RATIO: "50", "cpu": "2"}))
    start = term.version()
    versions, keys_ = [], []
    for i in range(9):
        scorer.observe(half if i % 2 else one)  # every rebuilt mix differs from the last
        scorer.sync()
        versions.append(term.version() - start)
        keys_.append(scorer.key)
    # while its window fills, the online mix rebuilds once half as many placements as it holds
    # have come since the last build (after 1, 2, 3, 5 placements), then every 4 (after 9)
    assert versions == [1, 2, 3, 3, 4, 4, 4, 4, 5]
    assert len(set(keys_)) == 5 and keys_[3] == keys_[2]  # cached scores dropped only on a change
    mix = term.mix()
    assert dict(zip(mix.shapes, mix.weights, strict=True)) == pytest.approx(
        {TaskShape(4000, 100, 1): 5 / 9, TaskShape(2000, 50, 1): 4 / 9}
    )


def test_a_steady_workload_keeps_the_scores_cached() -> None:
    """With the default tolerance a rebuilt mix equal to the one in use changes nothing, so the
    scorer keeps every cached score; a new shape taking over the window does refresh it."""
    term = FragmentationTerm(FragmentationSettings(refresh_every=4))
    scorer = NodeScorer(ScoringConfig(), {"fragmentation": term})
    one, half = pod_request(pod(gpus(1, cpu="4"))), pod_request(pod({CORE: "50", RATIO: "50", "cpu": "2"}))
    scorer.observe(one)
    scorer.sync()
    key = scorer.key
    for _ in range(12):
        scorer.observe(one)
        scorer.sync()
    assert scorer.key == key
    for _ in range(8):
        scorer.observe(half)
        scorer.sync()
    assert scorer.key != key
    assert TaskShape(2000, 50, 1) in term.mix().shapes


def test_settings_from_config() -> None:
    text = """
fragmentation:
  window: 300
  refreshEvery: 20
  tolerance: 0.1
  prior:
    - {cpu: "4", memory: 16Gi, gpuShare: 50, gpus: 1, weight: 3}
    - {cpu: 500m, weight: 1}
    - {cpu: "16", gpus: 8, models: [H100-80GB-HBM3], weight: 1}
"""
    cfg = ScoringConfig.from_dict(yaml.safe_load(text))
    s = cfg.fragmentation
    assert (s.window, s.refresh_every, s.prior_weight, s.tolerance) == (300, 20, 500.0, 0.1)
    mix = s.prior_mix()
    assert mix is not None and dict(zip(mix.shapes, mix.weights, strict=True)) == pytest.approx(
        {
            TaskShape(4000, 50, 1, memory_mib=16 * 1024): 0.6,
            TaskShape(500): 0.2,
            TaskShape(16_000, 100, 8, ("H100-80GB-HBM3",)): 0.2,
        }
    )
    assert ScoringConfig.from_dict(cfg.to_dict()) == cfg
    term = NodeScorer(cfg).components["fragmentation"]
    assert term.mix().shapes  # seeded by the prior before any pod is seen
    for bad in (
        {"window": 0},
        {"tolerance": 1.5},
        {"colour": 1},
        {"prior": [{"gpus": 2, "gpuShare": 50}]},
        {"prior": [{"cpu": "x"}]},
        {"prior": [{"cpu": "1", "weight": 0}]},
    ):
        with pytest.raises(ValueError):
            ScoringConfig.from_dict({"fragmentation": bad})
    for key in ("window", "refreshEvery", "priorWeight", "coverage", "tolerance"):
        for value in ("x", [1]):
            with pytest.raises(ValueError, match=rf"^fragmentation\.{key}: expected a number"):
                ScoringConfig.from_dict({"fragmentation": {key: value}})


def test_memoised_scores_equal_score_node_on_every_state() -> None:
    """The memo keys free CPU and memory by their positions among the mix's requests: exact,
    never stale."""
    rng = random.Random(5)
    gib = 1024  # MiB
    shapes = (
        TaskShape(2000, 30, 1, memory_mib=8 * gib),
        TaskShape(8000, 100, 1, memory_mib=200 * gib),
        TaskShape(12_500),
        TaskShape(16_000, 100, 2, memory_mib=64 * gib),
    )
    prior = tuple((s, w) for s, w in zip(shapes, (3.0, 2.0, 1.0, 1.0), strict=True))
    term = FragmentationTerm(FragmentationSettings(prior=prior))
    mix = term.mix()
    requests = [
        pod_request(pod({CORE: "30", RATIO: "30", "cpu": "2", "memory": "8Gi"})),
        pod_request(pod(gpus(1, cpu="8"))),
        pod_request(pod(gpus(2, cpu="3", memory="100Gi"))),
        pod_request(pod({"cpu": "5", "memory": "1500Mi"})),
    ]
    for _ in range(200):
        cpu = rng.choice([rng.randint(0, 32_000), 7999, 8000, 8001, 10_000, 10_001, 14_500, 32_000])
        mem_gib = rng.choice([rng.randint(0, 512), 8, 64, 72, 199, 200, 201, 300, 512])
        state = NodeState(
            "l1", build_inventory(l40s_device("l1")), {}, {"cpu": 32_000, "memory": 512 * 2**30}
        )
        for minor in rng.sample(range(8), rng.randint(0, 6)):
            use_gpus(state, minor, share=rng.choice([30, 60, 100]))
        if cpu < 32_000 or mem_gib < 512:
            state.add_pod("ns/cpu", None, 32_000 - cpu, (512 - mem_gib) * 2**30 + rng.choice([0, 1, 2**19]))
        for req in requests:
            shape = task_shape(req)
            assert shape is not None
            want = score_node(
                GPUSummary.of(state).free_pct,
                state.cpu_free_milli,
                "L40S",
                shape,
                mix,
                memory_free_mib=state.memory_free // 2**20,
            )
            assert term.placement(state, req) == want


def test_model_pressure_is_kept_from_the_cluster_and_changes_the_version() -> None:
    """Idle GPU per model is a NodeTable total kept as pods come and go; the term's pressure is
    the mix's, rounded, and a change of it changes the version (cached scores are dropped)."""
    h100_only = TaskShape(8000, 100, 1, ("H100-80GB-HBM3",))
    prior = ((h100_only, 1.0), (TaskShape(8000, 100, 1), 1.0))
    term = FragmentationTerm(FragmentationSettings(prior=prior))
    cluster = ClusterState()
    for name, device in (("h1", dgx_h100_device("h1")), ("l1", l40s_device("l1")), ("l2", l40s_device("l2"))):
        cluster.upsert_node(
            {"metadata": {"name": name}, "status": {"allocatable": {"cpu": "64", "memory": "1Ti"}}}
        )
        cluster.set_device(device)
    models = {n: gpu_model(s) for n, s in cluster.nodes.items()}
    assert models == {"h1": "H100-80GB-HBM3", "l1": "L40S", "l2": "L40S"}

    def brute() -> dict[str, float]:
        idle: dict[str, int] = {}
        for state in cluster.nodes.values():
            idle[gpu_model(state)] = idle.get(gpu_model(state), 0) + sum(GPUSummary.of(state).free_pct)
        raw = term.mix().model_pressure(idle)
        return {m: round(p * PRESSURE_LEVELS) / PRESSURE_LEVELS for m, p in raw.items()}

    # 8 H100 + 16 L40S idle: half the demand (the H100-only shape) wants 12 GPUs' worth of the
    # idle 24, all of it H100: pressure min(1, 12 / 8) = 1 on H100, 0 on L40S
    assert term.pressure(cluster.table) == brute() == {"H100-80GB-HBM3": 1.0, "L40S": 0.0}
    before = term.version(cluster.table)
    req = pod_request(pod(gpus(4, cpu="8")))
    for i, node in enumerate(("l1", "l1", "l2", "l2")):
        got = cluster.allocate(req, node)
        assert isinstance(got, Allocation)
        cluster.assign(f"ns/p{i}", node, got.devices, 8000, 2**30)
        assert term.pressure(cluster.table) == brute()
    # all 16 L40S busy: 8 idle H100, the H100-only half wants 4 of them
    assert term.pressure(cluster.table) == {"H100-80GB-HBM3": 0.5, "L40S": 1.0}
    assert term.version(cluster.table) != before
    cluster.unassign("ns/p0")
    assert term.pressure(cluster.table) == brute()
    # the node's score reads the pressure of its model from its own table
    shape = task_shape(req)
    h1 = cluster.nodes["h1"]
    want = score_node(
        GPUSummary.of(h1).free_pct,
        h1.cpu_free_milli,
        gpu_model(h1),
        shape,
        term.mix(),
        memory_free_mib=h1.memory_free // 2**20,
        model_pressure=brute()[gpu_model(h1)],
    )
    assert term.placement(h1, req) == want
