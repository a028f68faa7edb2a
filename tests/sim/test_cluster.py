"""The simulated cluster is the production core, read through its NodeTable's columns."""

import random

import numpy as np
import pytest
from sim_helpers import make_state, request

from allocator.core.cluster.state import affinity_matches, resources_fit
from allocator.core.node.gpu_summary import GPUSummary
from allocator.core.scoring.fragmentation import node_fragment
from allocator.core.scoring.workload_mix import TaskShape, WorkloadMix
from apis.annotations import parse_device_allocated
from simulator.cluster import SimulationError
from simulator.policies import BestFitPolicy

SPEC = [(16_000, 1_000, [100, 40], 8_000), (8_000, 4_000, [100, 100, 100, 100], 8_000)]


def feasible(cluster, req) -> list[bool]:
    return cluster.feasible(req).mask.tolist()


def test_feasibility_checks_cpu_memory_sharing_and_whole_gpus() -> None:
    cluster = make_state(SPEC)
    assert feasible(cluster, request(8_000)) == [True, True]
    assert feasible(cluster, request(8_001)) == [False, False]
    assert feasible(cluster, request(1_000, mem=2_000)) == [False, True]
    assert feasible(cluster, request(1_000, 50, 1)) == [True, True]
    assert feasible(cluster, request(1_000, 100, 2)) == [False, True]
    assert feasible(cluster, request(1_000, 100, 4)) == [False, True]
    assert cluster.feasible(request(1_000, 100, 2)).names == ["n1"]


def test_gpu_model_constraint_is_required_node_affinity() -> None:
    cluster = make_state(SPEC, model="T4")
    assert feasible(cluster, request(1_000, 50, 1, models=("G2",))) == [False, False]
    assert feasible(cluster, request(1_000, 50, 1, models=("G2", "T4"))) == [True, True]


def test_place_goes_through_the_core_and_the_columns_follow() -> None:
    cluster = make_state(SPEC)
    before = cluster.version.copy()
    pods = cluster.pods_free.copy()
    req = request(2_000, 100, 2, mem=1_000)
    allocation = cluster.allocate(1, req)
    cluster.assign(1, req, allocation)
    assert allocation.minors("gpu") == [0, 1]
    state = cluster.states[1]
    assert state.pods[req.key].allocations.minors("gpu") == [0, 1]
    assert cluster.free_pct(1) == (0, 0, 100, 100) == GPUSummary.of(state).free_pct
    assert cluster.gpu_matrix.tolist() == [[100, 40, -1, -1], [0, 0, 100, 100]]
    assert (cluster.gpu_free_total[1], cluster.gpu_full_count[1], cluster.gpu_free_max[1]) == (200, 2, 100)
    assert (cluster.cpu_free[1], cluster.mem_free[1]) == (6_000, 3_000 * 2**20)
    assert (cluster.pods_free == pods - [0, 1]).all()
    assert (cluster.version != before).tolist() == [False, True]  # only n1 changed
    assert cluster.allocated_pct == 200 + 60  # n0 arrived with 60% of a GPU in use
    cluster.unassign(req)
    assert cluster.free_pct(1) == (100,) * 4 and cluster.cpu_free[1] == 8_000
    assert cluster.gpu_matrix[1].tolist() == [100] * 4 and cluster.allocated_pct == 60


def test_a_preferred_gpu_is_taken_when_it_fits_and_ignored_otherwise() -> None:
    cluster = make_state(SPEC)
    share = request(1_000, 30, 1)
    assert cluster.allocate(0, share, prefer=(1,)).minors("gpu") == [1]  # 40% free holds 30%
    cluster.assign(0, share, cluster.allocate(0, share, prefer=(1,)))
    assert cluster.free_pct(0) == (100, 10)
    other = request(1_000, 30, 1, name="q")
    assert cluster.allocate(0, other, prefer=(1,)).minors("gpu") == [0]  # GPU 1 has only 10% left


def test_a_node_that_cannot_take_the_pod_is_an_error_not_an_overcommit() -> None:
    cluster = make_state(SPEC)
    with pytest.raises(SimulationError):
        cluster.allocate(0, request(1_000, 100, 2))
    assert np.all(cluster.gpu_count == [2, 4])


def test_vectorised_checks_equal_the_cores_resources_fit_and_affinity(rng: random.Random) -> None:
    cluster = make_state(
        [
            (16_000, 4_000, [100, 40], 8_000),
            (8_000, 2_000, [100, 0, 100, 100], 1_000),
            (4_000, 1_000, [], 500),
        ]
    )
    for _ in range(60):
        req = request(
            rng.choice([0, 500, 1_000, 7_000]),
            mem=rng.choice([0, 500, 1_500, 3_000]),
            models=rng.choice([(), ("M",), ("X",)]),
        )
        got = cluster.fits_mask(req).tolist()
        want = [resources_fit(s, req.pod) is None and affinity_matches(s, req.pod) for s in cluster.states]
        assert got == want


def test_allocations_written_are_valid_annotations() -> None:
    cluster = make_state(SPEC)
    req = request(1_000, 40, 1)
    allocation = cluster.allocate(0, req, prefer=(1,))
    parsed = parse_device_allocated(allocation.to_json())
    (entry,) = parsed.by_type["gpu"]
    assert entry.minor == 1 and entry.id == "GPU-n0-1"
    assert {k: v.value() for k, v in entry.resources.items()} == {
        "koordinator.sh/gpu-core": 40,
        "koordinator.sh/gpu-memory-ratio": 40,
        "koordinator.sh/gpu-memory": 40 * 32 * 2**30 // 100,  # 40% of an (assumed) 32 GiB GPU
    }


def test_a_step_reports_allocated_gpu_and_fragmentation() -> None:
    mix = WorkloadMix((TaskShape(2_000, 30, 1), TaskShape(4_000, 100, 1)), (0.5, 0.5))
    cluster = make_state(SPEC)
    cluster.metrics_mix = mix
    step = cluster.place((request(1_000, 30, 1),), BestFitPolicy([0, 1], random.Random(1)))
    (placed,) = step.placed
    assert placed.node == 0 and placed.allocation.minors("gpu") == [1]  # best fit: 40% free
    brute = sum(
        node_fragment(cluster.free_pct(i), int(cluster.cpu_free[i]), mix.compiled_for("M")) for i in range(2)
    )
    assert step.fragmented == pytest.approx(brute) and step.fragmented > 0
    assert step.allocated_pct == cluster.allocated_pct == 60 + 30
    failed = cluster.place((request(1_000, 100, 8),), BestFitPolicy([0, 1], random.Random(1)))
    assert failed.placed == () and failed.allocated_pct == 90 and failed.fragmented == step.fragmented
