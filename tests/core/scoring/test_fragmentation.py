"""Hand-computed fragmentation: FGD's measure (§3) on one node, GPUs free [100, 30, 0, 100] %,
8 cores free; topoalloc's expected waste (`best_of_draws`, `hole_waste_table`, `node_waste`) and
its placement key (`rank_key`, `key_value`, `score_node`) on tiny mixes."""

import pytest

from allocator.core.scoring.fragmentation import (
    NODE_STEP_PCT,
    best_of_draws,
    best_placement,
    cpu_starved,
    hole_waste_table,
    key_value,
    node_fragment,
    node_waste,
    placement_options,
    rank_key,
    score_node,
    whole_gpu_pick,
)
from allocator.core.scoring.workload_mix import TaskShape, WorkloadMix

CPU_ONLY = TaskShape(1_000)
HALF = TaskShape(4_000, 50, 1)
WHOLE = TaskShape(2_000, 100, 1)
TWO = TaskShape(16_000, 100, 2)
MIX = WorkloadMix((CPU_ONLY, HALF, WHOLE, TWO), (0.2, 0.3, 0.3, 0.2))
NODE = [100, 30, 0, 100]


def test_fragment_of_one_node_for_one_shape_each() -> None:
    one = {s: node_fragment(NODE, 8_000, WorkloadMix((s,), (1.0,)).compiled_for("M")) for s in MIX.shapes}
    assert one[CPU_ONLY] == 230  # no GPU wanted: all idle GPU is fragment
    assert one[HALF] == 30  # fits; only GPUs with < 50% free count: 30 + 0
    assert one[WHOLE] == 30  # fits on a free GPU; the 30% GPU is fragment
    assert one[TWO] == 230  # two free GPUs, but 16 cores > 8 free: CPU starves it


def test_node_fragment_is_the_mix_expectation() -> None:
    assert node_fragment(NODE, 8_000, MIX.compiled_for("M")) == pytest.approx(
        0.2 * 230 + 0.3 * 30 + 0.3 * 30 + 0.2 * 230
    )


def test_a_shape_that_rejects_the_model_sees_all_idle_gpu_as_fragment() -> None:
    only_g2 = WorkloadMix((TaskShape(4_000, 50, 1, ("G2",)),), (1.0,))
    assert node_fragment(NODE, 8_000, only_g2.compiled_for("T4")) == 230
    assert node_fragment(NODE, 8_000, only_g2.compiled_for("G2")) == 30


def test_a_node_without_idle_gpu_has_no_fragment() -> None:
    assert node_fragment([0, 0], 0, MIX.compiled_for("M")) == 0


def test_sharing_task_is_tried_on_each_distinct_gpu_and_the_best_growth_wins() -> None:
    task = TaskShape(1_000, 20, 1)
    options = {o.gpus: o.growth for o in placement_options(NODE, 8_000, task, MIX.compiled_for("M"))}
    # before 110; on GPU 1 -> [100,10,0,100], 7 cores: 0.2*210 + 0.3*10 + 0.3*10 + 0.2*210 = 90
    # on GPU 0 -> [80,30,0,100]: 0.2*210 + 0.3*30 + 0.3*110 + 0.2*210 = 126; GPU 3 equals GPU 0
    assert options == pytest.approx({(0,): 16.0, (1,): -20.0})
    assert best_placement(NODE, 8_000, task, MIX.compiled_for("M")).gpus == (1,)


def test_whole_gpu_tasks_take_the_lowest_free_gpus_and_cpu_only_tasks_change_cpu_only() -> None:
    assert whole_gpu_pick(NODE, 2) == (0, 3)
    assert whole_gpu_pick(NODE, 3) is None
    (whole,) = placement_options(NODE, 8_000, WHOLE, MIX.compiled_for("M"))
    assert whole.gpus == (0,)
    (cpu,) = placement_options(NODE, 8_000, TaskShape(5_000), MIX.compiled_for("M"))
    # 3 cores left: HALF (4 cores) no longer fits, its 0.3 share turns all 230 into fragment
    assert cpu.gpus == () and cpu.growth == pytest.approx(0.3 * (230 - 30))


# -- topoalloc's measure ------------------------------------------------------------------------
# A tiny mix: 40% CPU-only, 30% half a GPU (1 core, 1 GiB), 30% one whole GPU (2 cores, 64 GiB).
SMALL = WorkloadMix(
    (TaskShape(1_000), TaskShape(1_000, 50, 1, memory_mib=1024), TaskShape(2_000, 100, 1, memory_mib=65_536)),
    (0.4, 0.3, 0.3),
)


def test_best_of_draws_keeps_the_best_fill_among_the_next_tasks() -> None:
    # fills leaving 0 (p 0.3) or 20 (p 0.2); with 2 draws: P(some draw leaves 0) = 1 - 0.7² = 0.51,
    # P(none leaves 0 but one leaves 20) = 0.7² - 0.5² = 0.24, P(neither) = 0.25 -> idle 70 stays
    assert best_of_draws([(20.0, 0.2), (0.0, 0.3)], 70.0, 2) == pytest.approx(0.24 * 20 + 0.25 * 70)
    assert best_of_draws([], 30.0, 24) == 30.0  # nothing fits: the hole stays idle


def test_hole_waste_table_by_hand() -> None:
    v1 = hole_waste_table(((50, 0.3),), 1)
    # f < 50: no task fits, f stays idle; V[50] = 0.3·V[0] + 0.7·50 = 35;
    # V[70] = 0.3·V[20] + 0.7·70 = 0.3·20 + 49 = 55; V[100] is 0 by convention
    assert (v1[30], v1[50], v1[70], v1[100]) == pytest.approx((30, 35, 55, 0))
    v2 = hole_waste_table(((50, 0.3),), 2)
    assert v2[50] == pytest.approx(0.49 * 50)  # two chances: idle only if both draws miss (0.7²)


def test_node_waste_by_hand_with_cpu_and_memory() -> None:
    mix = SMALL.compiled_for("M")
    # horizon 1, node [100, 50]: V[50] = 0.3·0 + 0.7·50 = 35 (the half fills it, else it idles).
    # The fresh GPU: whole (p 0.3) leaves 0, half (p 0.3) leaves V[50] = 35, nothing else (0.4) 100:
    # 0.3·0 + 0.3·35 + 0.4·100 = 50.5; the node: 35 + 50.5 = 85.5
    assert node_waste([100, 50], 8_000, mix, 200_000, horizon=1) == pytest.approx(85.5)
    # 32 GiB free: the whole-GPU shape (64 GiB) no longer fits, fresh = 0.3·35 + 0.7·100 = 80.5
    assert node_waste([100, 50], 8_000, mix, 32_768, horizon=1) == pytest.approx(35 + 80.5)
    # The CPU budget: the mix's GPU tasks ask 0.3·1000 + 0.3·2000 = 900 milli-cores per
    # 0.3·50 + 0.3·100 = 45 GPU %, 20 per %. 8 cores feed 400 % >= 150 idle: nothing starved.
    assert mix.cpu_per_gpu_pct == pytest.approx(20)
    assert cpu_starved([100, 50], 8_000, mix) == 0.0
    # 2 cores (one 2-core step) feed 100 %: 50 of the 150 idle starve, on top of the holes' 85.5
    assert cpu_starved([100, 50], 2_000, mix) == pytest.approx(50)
    assert node_waste([100, 50], 2_000, mix, None, horizon=1) == pytest.approx(85.5 + 50)
    assert node_waste([100, 50], 3_999, mix, None, horizon=1) == pytest.approx(85.5 + 50)  # same step
    # 1.5 cores free: the whole-GPU shape (2 cores) does not fit either (holes 35 + 80.5; memory
    # unchecked, None), and less than one step feeds nothing: all 150 starve
    assert node_waste([100, 50], 1_500, mix, None, horizon=1) == pytest.approx(35 + 80.5 + 150)
    # half a core: nothing fits, every idle percent is waste twice over
    assert node_waste([100, 50], 500, mix, None, horizon=1) == pytest.approx(150 + 150)
    assert node_waste([0, 0], 0, mix) == 0.0


def test_a_cpu_hungry_task_goes_where_it_starves_no_gpu() -> None:
    """3 cores on a node with 6 free leave one step (100 %) for its 200 idle GPU %: 100 starve.
    On a node with 20 cores free nothing does, so that node ranks better by 100 % (20 steps)."""
    task = TaskShape(3_000)
    tight = score_node([100, 100], 6_000, "M", task, SMALL, horizon=1)
    roomy = score_node([100, 100], 20_000, "M", task, SMALL, horizon=1)
    assert tight is not None and roomy is not None
    assert tight.node_cost == pytest.approx(100) and roomy.node_cost == pytest.approx(0)
    assert tight.key == (-20, 0) and roomy.key == (0, 0)
    assert roomy.score > tight.score


def test_rank_key_rounds_the_node_cost_and_keeps_the_hole_cost_exact() -> None:
    assert rank_key(0.0, 3.0) == (0, -3.0)
    assert rank_key(NODE_STEP_PCT * 0.49, 0.0)[0] == 0  # within half a step of 0: ties with 0
    assert rank_key(NODE_STEP_PCT * 0.51, 0.0)[0] == -1
    assert rank_key(-NODE_STEP_PCT * 2, 0.0)[0] == 2


def test_key_value_keeps_the_lexicographic_order() -> None:
    steps = [-400, -41, -3, -1, 0, 1, 2, 17, 400]
    holes = [-800.0, -35.5, -0.1, 0.0, 0.1, 12.0, 800.0]
    ordered = [(s, h) for s in steps for h in holes]  # already in lexicographic order
    values = [key_value(k) for k in ordered]
    assert values == sorted(values) and len(set(values)) == len(values)
    assert min(values) > 0 and max(values) < 100


def test_score_node_by_hand() -> None:
    # Node [100, 50, 0], 8 cores, 200 GiB; horizon 1; before: 85.5 (as above). Half-GPU task:
    # on GPU 1 (the 50% hole): after [100, 0, 0]: 50.5, growth -35; its own hole change on the
    # canonical table V[0] - V[50] = -35, so node cost = growth - hole = 0, key (0, 35).
    # On GPU 0: after [50, 50, 0]: 35 + 35 = 70, growth -15.5; hole V[50] - V[100] = 35, node
    # cost -50.5, key (round(50.5 / 5) = 10, -35). The node key comes first: GPU 0 wins, although
    # the hole key alone would complete the 50% hole (with 40% CPU-only tasks and one draw, a
    # fresh GPU is likely to idle; two half-GPU holes each have a chance).
    task = TaskShape(1_000, 50, 1, memory_mib=1024)
    on_hole = score_node([100, 50, 0], 8_000, "M", task, SMALL, memory_free_mib=200_000, horizon=1)
    assert on_hole is not None
    assert on_hole.gpus == (0,)
    assert on_hole.node_cost == pytest.approx(-50.5) and on_hole.hole_cost == pytest.approx(35)
    assert on_hole.key == rank_key(-50.5, 35) and on_hole.score == key_value(on_hole.key)
    # model pressure 0.5 costs 0.5 per GPU percent taken: 25 more node cost, same GPU
    pressed = score_node(
        [100, 50, 0], 8_000, "M", task, SMALL, memory_free_mib=200_000, model_pressure=0.5, horizon=1
    )
    assert pressed is not None and pressed.node_cost == pytest.approx(-25.5) and pressed.score < on_hole.score
    assert score_node([0, 40, 0], 8_000, "M", task, SMALL, horizon=1) is None  # no 50% free
