"""The one controller runner: passes on wake and resync, leadership, a guarded pass, bounded writes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from allocator.runtime.runner import Batch, ControllerMetrics, Runner, RunnerSettings
from allocator.runtime.workqueue import Backoff


class Recorder:
    def __init__(self) -> None:
        self.batches: list[Batch] = []
        self.step_downs = 0
        self.fail = False

    async def reconcile(self, batch: Batch) -> None:
        self.batches.append(batch)
        if self.fail:
            raise RuntimeError("a bug")

    def step_down(self) -> None:
        self.step_downs += 1


@contextlib.asynccontextmanager
async def running(runner: Runner) -> AsyncIterator[Runner]:
    task = asyncio.create_task(runner.run())
    try:
        yield runner
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def make(rec: Recorder, leader: list[bool] | None = None, **settings: float) -> Runner:
    lead = leader if leader is not None else [True]
    s = RunnerSettings(
        resync=settings.get("resync", 60.0),
        batch_delay=0.0,
        concurrency=2,
        backoff=Backoff(settings.get("initial", 0.05), 1.0),
    )
    return Runner(
        "test",
        rec,
        s,
        is_leader=lambda: lead[0],
        synced=lambda: True,
        metrics=ControllerMetrics(CollectorRegistry()),
    )


async def test_the_first_pass_is_full_then_woken_keys_come_in_one_batch() -> None:
    rec = Recorder()
    runner = make(rec)
    async with running(runner):
        await runner.wait_passes(1)
        assert rec.batches[0].full
        runner.wake("a")
        runner.wake("b")
        runner.wake("a")
        await runner.wait_passes(1)
    woken = [b for b in rec.batches[1:] if b.keys]
    assert woken[0].keys == {"a", "b"} and not woken[0].full


async def test_a_resync_period_brings_a_full_pass_without_a_wake() -> None:
    rec = Recorder()
    runner = make(rec, resync=0.1)
    async with running(runner):
        await runner.wait_passes(3, timeout=5)
    assert sum(b.full for b in rec.batches) >= 3


async def test_retry_brings_a_key_back_after_its_pause() -> None:
    rec = Recorder()
    runner = make(rec, initial=0.2)
    async with running(runner):
        await runner.wait_passes(1)
        start = asyncio.get_running_loop().time()
        runner.retry("a")
        assert runner.waiting("a")
        while not any("a" in b.keys for b in rec.batches):
            await runner.wait_passes(1, timeout=5)
        assert asyncio.get_running_loop().time() - start >= 0.19


async def test_a_failing_pass_is_counted_and_the_next_runs() -> None:
    rec = Recorder()
    rec.fail = True
    registry = CollectorRegistry()
    runner = Runner(
        "t",
        rec,
        RunnerSettings(resync=60, batch_delay=0),
        is_leader=lambda: True,
        synced=lambda: True,
        metrics=ControllerMetrics(registry),
    )
    async with running(runner):
        await runner.wait_passes(1)
        runner.wake("x")
        await runner.wait_passes(1)
    assert registry.get_sample_value("topoalloc_controller_failed_passes_total", {"controller": "t"}) >= 2
    assert registry.get_sample_value("topoalloc_controller_passes_total", {"controller": "t"}) >= 2


async def test_no_pass_off_the_leader_and_one_step_down_when_leadership_goes() -> None:
    rec = Recorder()
    leader = [False]
    runner = make(rec, leader)
    async with running(runner):
        runner.wake("a")
        await asyncio.sleep(0.1)
        assert rec.batches == []
        leader[0] = True
        runner.wake("a")
        await runner.wait_passes(1)
        assert rec.batches[-1].full  # leadership gained: look at everything
        leader[0] = False
        for _ in range(3):
            runner.wake("b")
            await asyncio.sleep(0.05)
        assert rec.step_downs == 1
        leader[0] = True
        runner.wake("c")
        await runner.wait_passes(1)
        assert rec.batches[-1].full


async def test_spawned_writes_keep_their_keys_busy_and_run_two_at_a_time() -> None:
    rec = Recorder()
    runner = make(rec)
    running_now = 0
    most = 0
    release = asyncio.Event()

    async def write() -> None:
        nonlocal running_now, most
        running_now += 1
        most = max(most, running_now)
        await release.wait()
        running_now -= 1

    async with running(runner):
        await runner.wait_passes(1)
        for key in "abcd":
            runner.spawn([key], write())
        runner.wake("a")
        runner.wake("e")
        await runner.wait_passes(1)
        assert rec.batches[-1].keys == {"e"}  # a is busy: not handed out
        assert rec.batches[-1].select(["a", "e"]) == ["e"]
        release.set()
        await runner.drain()
        await runner.wait_passes(1)
        assert any("a" in b.keys for b in rec.batches)  # woken while busy: back once done
    assert most == 2


def test_a_full_batch_selects_every_known_key_not_busy() -> None:
    batch = Batch(frozenset(), True, 0.0, lambda k: k == "b")
    assert batch.select({"c", "a", "b"}) == ["a", "c"]
    woken = Batch(frozenset({"a", "gone"}), False, 0.0, lambda k: False)
    assert woken.select({"a", "c"}) == ["a"]


@pytest.mark.parametrize("count", [1, 2])
async def test_wait_passes_times_out_when_no_pass_runs(count: int) -> None:
    runner = make(Recorder(), [False])
    async with running(runner):
        with pytest.raises(TimeoutError):
            await runner.wait_passes(count, timeout=0.2)


async def test_a_follower_with_keys_queued_looks_at_its_leadership_only_when_woken() -> None:
    """Keys queued on a follower (its watch cache's changes) wait for it to lead: they do not make
    it look at its leadership every `batch_delay`."""
    rec = Recorder()
    asked = 0

    def is_leader() -> bool:
        nonlocal asked
        asked += 1
        return False

    settings = RunnerSettings(resync=60.0, batch_delay=0.01, concurrency=2)
    runner = Runner("test", rec, settings, is_leader=is_leader, synced=lambda: True)
    async with running(runner):
        runner.wake("a")
        await asyncio.sleep(0.3)  # 30 batch delays
    assert 1 <= asked <= 3 and rec.batches == []
