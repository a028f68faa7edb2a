"""A Reservation that preempts weighs PodDisruptionBudgets as a gang does: the real allocator (the
Reservations controller with the gang preemption machinery) against the fake API server."""

from __future__ import annotations

from typing import Any

from tests.gang.harness import bound_elsewhere
from tests.reservations.objects import reservation
from tests.support.allocator_harness import running_allocator, seed_nodes
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Pki
from tests.support.polling import until


def _evicted(fake: FakeApiServer) -> set[str]:
    """The fillers evicted so far (Terminating, or gone)."""
    pods: dict[str, Any] = {p["metadata"]["name"]: p for p in fake.list_objects("pods", "default")}
    fillers = {f"f-{n}-{m}" for n in ("gpu-1", "gpu-2") for m in range(8)}
    return {n for n in fillers if n not in pods or pods[n]["metadata"].get("deletionTimestamp")}


async def test_a_reservation_preempts_around_a_disruption_budget(fake_api: FakeApiServer, pki: Pki) -> None:
    # Both nodes full of priority-0 pods at equal cost; a budget allows none of gpu-1's to leave.
    # By name gpu-1 would go first: the budget sends the Reservation to gpu-2.
    seed_nodes(fake_api, ["gpu-1", "gpu-2"])
    for node in ("gpu-1", "gpu-2"):
        labels = {"app": "batch"} if node == "gpu-1" else {}
        for m in range(8):
            bound_elsewhere(fake_api, f"f-{node}-{m}", node, [m], labels=labels, priority=0)
    fake_api.put(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "batch", "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": "batch"}}},
            "status": {"disruptionsAllowed": 0},
        }
    )
    body = reservation("urgent", gpus=8)
    body["spec"]["template"]["spec"]["priority"] = 1000
    fake_api.put(body)
    async with running_allocator(fake_api, pki):
        await until(lambda: len(_evicted(fake_api)) == 8, timeout=15)
        assert _evicted(fake_api) == {f"f-gpu-2-{m}" for m in range(8)}
