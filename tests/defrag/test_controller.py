"""The migration controller with the real allocator on the fake API server: four nodes each run
two 1-GPU pods of a ReplicaSet while an 8-GPU pod waits. A dry run plans two moves and touches
nothing; enabled, it reserves the targets, evicts the pods once their rooms are Available, and a
restarted allocator reads the moves back and makes none twice; a PodDisruptionBudget keeps its pods."""

from __future__ import annotations

import dataclasses

from allocator.runtime.defrag_settings import DefragSettings
from tests.defrag.scenario import moves_made, running, world
from tests.support.allocator_harness import running_allocator
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Pki
from tests.support.polling import until

BASE = DefragSettings(enabled=True, interval=3600.0, min_wait=0.0, report_config_map="")


async def test_a_dry_run_plans_and_touches_nothing(fake_api: FakeApiServer, pki: Pki) -> None:
    world(fake_api)
    async with running_allocator(fake_api, pki, defrag=BASE) as run:
        controller = run.service.component("defrag").controller
        assert controller is not None
        plan = await controller.reconcile()
        assert len(plan.moves) == 2 and {m.source for m in plan.moves} == {plan.moves[0].source}
        assert [u.waiter for u in plan.unblocked] == ["pod default/big"]
        assert moves_made(fake_api) == [] and len(running(fake_api)) == 8


async def test_moves_reserve_then_evict_and_survive_a_restart(fake_api: FakeApiServer, pki: Pki) -> None:
    world(fake_api)
    live = dataclasses.replace(BASE, dry_run=False, max_migrating_per_workload=2)
    async with running_allocator(fake_api, pki, defrag=live) as run:
        controller = run.service.component("defrag").controller
        assert controller is not None
        plan = await controller.reconcile()
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
        controller = run.service.component("defrag").controller
        assert controller is not None
        await until(lambda: len(run.service.cache.reservations) >= 2, timeout=10)
        await controller.reconcile()
        await until(lambda: not set(moved) & set(running(fake_api)), timeout=10)
        assert len(running(fake_api)) == 6 and len(moves_made(fake_api)) == 2
        marked = [
            r["metadata"]["annotations"].get("topoalloc.io/defrag-evicted") for r in moves_made(fake_api)
        ]
        assert marked == ["true", "true"]
        await controller.reconcile()
        assert len(moves_made(fake_api)) == 2 and len(running(fake_api)) == 6


async def test_limits_cap_concurrent_moves(fake_api: FakeApiServer, pki: Pki) -> None:
    world(fake_api)
    live = dataclasses.replace(BASE, dry_run=False)  # one move per workload at a time
    async with running_allocator(fake_api, pki, defrag=live) as run:
        controller = run.service.component("defrag").controller
        assert controller is not None
        await controller.reconcile()
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
        controller = run.service.component("defrag").controller
        assert controller is not None
        plan = await controller.reconcile()
        assert plan.moves == () and "no pod may move" in plan.stuck[0][1]
        assert moves_made(fake_api) == []
