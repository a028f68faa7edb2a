import pytest

from allocator.core.scoring.workload_mix import OnlineMix, TaskShape, WorkloadMix

CPU = TaskShape(12_500)
HALF = TaskShape(4_000, 50, 1)
WHOLE = TaskShape(8_000, 100, 1)
EIGHT = TaskShape(64_000, 100, 8, ("G2",))


def test_from_counts_keeps_the_most_frequent_shapes_until_coverage_and_renormalises() -> None:
    mix = WorkloadMix.from_counts({CPU: 1, HALF: 5, WHOLE: 3, EIGHT: 1}, coverage=0.8)
    # 5/10 = 50% < 80%, 8/10 = 80% >= 80%: keep HALF and WHOLE, renormalise by 8
    assert mix.shapes == (HALF, WHOLE)
    assert mix.weights == pytest.approx((5 / 8, 3 / 8))


def test_equal_counts_are_ordered_by_shape_so_the_mix_is_deterministic() -> None:
    a = WorkloadMix.from_counts({WHOLE: 2, HALF: 2, CPU: 2}, coverage=0.5)
    b = WorkloadMix.from_counts({CPU: 2, HALF: 2, WHOLE: 2}, coverage=0.5)
    assert a.shapes == b.shapes and len(a.shapes) == 2


def test_compiled_mix_groups_by_gpu_request_and_drops_cpu_only_and_other_models() -> None:
    small_half = TaskShape(2_000, 50, 1)
    mix = WorkloadMix((CPU, HALF, small_half, WHOLE, EIGHT), (0.2, 0.2, 0.1, 0.3, 0.2))
    t4 = mix.compiled_for("T4")
    assert [(g.gpu_pct, g.gpu_count) for g in t4.groups] == [(50, 1), (100, 1)]  # EIGHT wants G2
    half = t4.groups[0]
    assert half.cpus == (2_000, 4_000)
    assert half.weight_fitting_cpu(1_999) == 0.0
    assert half.weight_fitting_cpu(2_000) == pytest.approx(0.1)
    assert half.weight_fitting_cpu(10_000) == pytest.approx(0.3)
    assert [(g.gpu_pct, g.gpu_count) for g in mix.compiled_for("G2").groups] == [(50, 1), (100, 1), (100, 8)]


def test_cpu_per_gpu_counts_only_gpu_tasks() -> None:
    mix = WorkloadMix((CPU, HALF, WHOLE), (0.5, 0.25, 0.25))
    # (0.25*4000 + 0.25*8000) / (0.25*0.5 + 0.25*1) GPUs
    assert mix.cpu_per_gpu_milli == pytest.approx(3000 / 0.375)


@pytest.mark.parametrize(
    "args",
    [(-1,), (1000, 101, 1), (1000, 50, 0), (1000, 0, 1), (1000, 50, 2)],
)
def test_invalid_shapes_are_rejected(args: tuple) -> None:
    with pytest.raises(ValueError):
        TaskShape(*args)


def test_weights_must_sum_to_one() -> None:
    with pytest.raises(ValueError):
        WorkloadMix((HALF, WHOLE), (0.5, 0.4))


def test_online_mix_is_the_window_alone_without_a_prior_and_forgets_old_tasks() -> None:
    online = OnlineMix(window=4, refresh_every=1, coverage=1.0)
    for shape in (WHOLE, WHOLE, HALF, HALF, HALF, CPU):
        online.observe(shape)
    mix = online.mix()  # window holds HALF, HALF, HALF, CPU
    assert dict(zip(mix.shapes, mix.weights, strict=True)) == pytest.approx({HALF: 0.75, CPU: 0.25})


def test_online_mix_blends_the_prior_by_its_weight() -> None:
    prior = WorkloadMix((WHOLE,), (1.0,))
    online = OnlineMix(prior, window=10, prior_weight=2.0, refresh_every=1, coverage=1.0)
    assert online.mix().shapes == (WHOLE,)
    for _ in range(6):
        online.observe(HALF)
    mix = dict(zip(online.mix().shapes, online.mix().weights, strict=True))
    assert mix == pytest.approx({HALF: 6 / 8, WHOLE: 2 / 8})


def test_online_mix_refreshes_only_every_n_observations_once_the_window_has_filled() -> None:
    online = OnlineMix(window=10, refresh_every=3, coverage=1.0)
    for _ in range(6):
        online.observe(HALF)
    first = online.mix()
    online.observe(WHOLE)
    online.observe(WHOLE)
    assert online.mix() is first  # 2 observations since the build, fewer than 3
    online.observe(WHOLE)
    assert WHOLE in online.mix().shapes


def test_online_mix_refreshes_geometrically_while_the_window_fills() -> None:
    online = OnlineMix(window=1000, refresh_every=200, coverage=1.0)
    online.observe(HALF)
    assert online.mix().shapes == (HALF,)
    online.observe(WHOLE)  # 1 since the build >= 2 // 2: rebuilt, not stuck on the first task
    assert set(online.mix().shapes) == {HALF, WHOLE}
    online.observe(CPU)  # 1 since the build >= 3 // 2: rebuilt again
    third = online.mix()
    assert sorted(third.weights) == pytest.approx([1 / 3] * 3)
    online.observe(CPU)  # 1 since the build < 4 // 2: kept
    assert online.mix() is third


def test_distance_is_the_probability_mass_that_moved() -> None:
    a = WorkloadMix((HALF, WHOLE), (0.5, 0.5))
    assert a.distance(a) == 0.0
    assert a.distance(WorkloadMix((HALF, WHOLE), (0.8, 0.2))) == pytest.approx(0.3)
    assert a.distance(WorkloadMix((CPU,), (1.0,))) == pytest.approx(1.0)  # nothing in common
    assert WorkloadMix((CPU,), (1.0,)).distance(a) == pytest.approx(1.0)


def test_online_mix_keeps_its_mix_while_the_workload_only_wobbles() -> None:
    online = OnlineMix(window=100, refresh_every=10, coverage=1.0, tolerance=0.05)
    for _ in range(50):
        online.observe(HALF)
        online.observe(WHOLE)
    steady = online.mix()
    for _ in range(3):  # 51 HALF : 49 WHOLE over the window, 0.01 from the mix in use
        online.observe(HALF)
        online.observe(HALF)
        online.observe(WHOLE)
        online.observe(WHOLE)
    online.observe(HALF)
    for _ in range(9):
        online.observe(HALF if _ % 2 else WHOLE)
    assert online.mix() is steady
    for _ in range(20):  # the window turns towards HALF: 0.1 or more has moved
        online.observe(HALF)
    moved = online.mix()
    assert moved is not steady
    assert dict(zip(moved.shapes, moved.weights, strict=True))[HALF] > 0.55
    with pytest.raises(ValueError):
        OnlineMix(tolerance=1.0)
