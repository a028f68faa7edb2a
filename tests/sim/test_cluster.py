import numpy as np
import pytest
from sim_helpers import make_state, request

SPEC = [(16_000, 1_000, [100, 40], 8_000), (8_000, 4_000, [100, 100, 100, 100], 8_000)]


def test_feasibility_checks_cpu_memory_sharing_and_whole_gpus() -> None:
    state = make_state(SPEC)
    assert state.feasible(request(8_000)).tolist() == [True, True]
    assert state.feasible(request(8_001)).tolist() == [False, False]
    assert state.feasible(request(1_000, mem=2_000)).tolist() == [False, True]
    assert state.feasible(request(1_000, 50, 1)).tolist() == [True, True]
    assert state.feasible(request(1_000, 100, 2)).tolist() == [False, True]
    assert state.feasible(request(1_000, 100, 4)).tolist() == [False, True]


def test_gpu_model_constraint() -> None:
    state = make_state(SPEC, model="T4")
    assert state.feasible(request(1_000, 50, 1, models=("G2",))).tolist() == [False, False]
    assert state.feasible(request(1_000, 50, 1, models=("G2", "T4"))).tolist() == [True, True]


def test_place_updates_the_summaries_and_the_version() -> None:
    state = make_state(SPEC)
    state.place(1, request(2_000, 100, 2, mem=1_000), (0, 1))
    assert state.gpus[1] == [0, 0, 100, 100]
    assert state.gpu_matrix[1].tolist() == [0, 0, 100, 100]
    assert (state.gpu_free_total[1], state.gpu_full_count[1], state.gpu_free_max[1]) == (200, 2, 100)
    assert (state.cpu_free[1], state.mem_free[1]) == (6_000, 3_000)
    assert state.version.tolist() == [0, 1]
    assert state.allocated_pct == 200 + 60  # n0 arrived with 60% of a GPU in use


def test_place_refuses_to_overcommit() -> None:
    state = make_state(SPEC)
    with pytest.raises(ValueError):
        state.place(0, request(1_000, 50, 1), (1,))  # GPU 1 has 40% free
    with pytest.raises(ValueError):
        state.place(0, request(9_000, 10, 1), (0,))
    assert np.all(state.gpu_count == [2, 4])
