"""The migration controller with the real allocator on the fake API server: four nodes each run
two 1-GPU pods of a ReplicaSet while an 8-GPU pod waits. A dry run plans two moves and touches
nothing; enabled, it reserves the targets, evicts the pods once their rooms are Available (woken by
its own Reservations, though its interval is an hour), and a restarted allocator reads the moves
back and makes none twice; a PodDisruptionBudget keeps its pods; a pass reads pods and budgets
from the watch cache, never a LIST.

The controller runs on its runner from the start (its first pass once woken); a test steps it by
waking it and waiting for the pass (`next_plan`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from allocator.core.defrag.plan import DefragPlan
from allocator.runtime.defrag_settings import DefragSettings
from tests.defrag.scenario import moves_made, running, waiter, world
from tests.support.allocator_harness import running_allocator
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Pki
from tests.support.polling import until

BASE = DefragSettings(enabled=True, interval=3600.0, min_wait=0.0, report_config_map="")


def migrations(run: Any) -> Any:
    """The migration controller of a running allocator."""
    return run.service.component("defrag").controller


async def next_plan(controller: Any) -> DefragPlan:
    """Wake the controller and wait for its pass; the plan it made."""
    await controller.runner.wait_passes(1)
    assert controller.last_plan is not None
    return controller.last_plan  # type: ignore[no-any-return]


def marked(fake: FakeApiServer) -> list[str | None]:
    """Per move made, whether its Reservation says its pod was evicted."""
    return [r["metadata"]["annotations"].get("topoalloc.io/defrag-evicted") for r in moves_made(fake)]


async def test_a_dry_run_plans_and_touches_nothing(fake_api: FakeApiServer, pki: Pki) -> None:
    world(fake_api)
    async with running_allocator(fake_api, pki, defrag=BASE) as run:
        plan = await next_plan(migrations(run))
        assert len(plan.moves) == 2 and {m.source for m in plan.moves} == {plan.moves[0].source}
        assert [u.waiter for u in plan.unblocked] == ["pod default/big"]
        assert moves_made(fake_api) == [] and len(running(fake_api)) == 8


async def test_moves_reserve_then_evict_and_survive_a_restart(fake_api: FakeApiServer, pki: Pki) -> None:
    world(fake_api, waiting=False)
    live = dataclasses.replace(BASE, dry_run=False, max_migrating_per_workload=2)
    async with running_allocator(fake_api, pki, defrag=live) as run:
        controller = migrations(run)
        await controller.runner.wait_passes(1)  # nothing waits yet
        waiter(fake_api)
        await until(lambda: "default/big" in run.service.cache.pods, timeout=10)
        plan = await next_plan(controller)
        made = moves_made(fake_api)
        assert len(made) == 2 and len(running(fake_api)) == 8  # reserved, nothing evicted yet
        targets = {r["spec"]["template"]["spec"]["nodeName"] for r in made}
        assert targets == {m.target for m in plan.moves}
        assert all(
            r["spec"]["allocateOnce"] and r["spec"]["owners"][0]["controller"]["name"] == "web-rs"
            for r in made
        )
        await until(
            lambda: all((r.get("status") or {}).get("phase") == "Available" for r in moves_made(fake_api)),
            timeout=10,
        )
    moved = sorted(m.key.partition("/")[2] for m in plan.moves)
    # A new leader reads the two moves back from their Reservations: no third, none twice.
    async with running_allocator(fake_api, pki, defrag=live) as run:
        controller = migrations(run)
        await until(lambda: len(run.service.cache.reservations) >= 2, timeout=10)
        await next_plan(controller)  # its first pass: the rooms are Available, the pods go
        await until(lambda: not set(moved) & set(running(fake_api)), timeout=10)
        await until(lambda: marked(fake_api) == ["true", "true"], timeout=10)  # marked once evicted
        assert len(running(fake_api)) == 6 and len(moves_made(fake_api)) == 2
        await next_plan(controller)
        assert len(moves_made(fake_api)) == 2 and len(running(fake_api)) == 6


async def test_a_room_turning_available_wakes_the_controller(fake_api: FakeApiServer, pki: Pki) -> None:
    """The interval is an hour: once a pass has made the moves (woken here by the test), only the
    change of its own Reservations brings the pass that evicts."""
    world(fake_api)
    live = dataclasses.replace(BASE, dry_run=False, max_migrating_per_workload=2)
    async with running_allocator(fake_api, pki, defrag=live) as run:
        migrations(run).runner.wake()
        await until(lambda: len(moves_made(fake_api)) == 2, timeout=10)
        await until(lambda: len(running(fake_api)) == 6, timeout=10)  # evicted: nobody asked
        await until(lambda: marked(fake_api) == ["true", "true"], timeout=10)


async def test_limits_cap_concurrent_moves(fake_api: FakeApiServer, pki: Pki) -> None:
    world(fake_api, waiting=False)
    live = dataclasses.replace(BASE, dry_run=False)  # one move per workload at a time
    async with running_allocator(fake_api, pki, defrag=live) as run:
        controller = migrations(run)
        await controller.runner.wait_passes(1)
        waiter(fake_api)
        await until(lambda: "default/big" in run.service.cache.pods, timeout=10)
        await next_plan(controller)
        assert len(moves_made(fake_api)) == 1
        await next_plan(controller)  # the first move is in flight: no second
        assert len(moves_made(fake_api)) == 1


async def test_a_pod_budget_allowing_no_disruption_keeps_its_pods(fake_api: FakeApiServer, pki: Pki) -> None:
    world(fake_api)
    fake_api.put(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": "web"}}, "minAvailable": 8},
            "status": {"disruptionsAllowed": 0},
        }
    )
    live = dataclasses.replace(BASE, dry_run=False, max_migrating_per_workload=2)
    async with running_allocator(fake_api, pki, defrag=live) as run:
        plan = await next_plan(migrations(run))
        assert plan.moves == () and "no pod may move" in plan.stuck[0][1]
        assert moves_made(fake_api) == []


async def test_a_pass_reads_pods_and_budgets_from_the_watch_cache(fake_api: FakeApiServer, pki: Pki) -> None:
    world(fake_api)
    async with running_allocator(fake_api, pki, defrag=BASE) as run:
        controller = migrations(run)
        await next_plan(controller)
        fake_api.clear_requests()
        for _ in range(3):
            plan = await next_plan(controller)
        assert len(plan.moves) == 2  # it still plans
        lists = [
            r.path
            for r in fake_api.requests("GET", watch=False)
            if r.path in ("/api/v1/pods", "/apis/policy/v1/poddisruptionbudgets")
        ]
        assert lists == []
