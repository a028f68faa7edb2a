"""Lease-based leader election between real electors over HTTP against the fake API server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from allocator.runtime.config import LeaderElection
from allocator.runtime.kube import KubeApi
from allocator.runtime.leader import LeaderElector
from tests.support.fakeapi import FakeApiServer
from tests.support.polling import until

NS = "kube-system"


def settings(identity: str) -> LeaderElection:
    return LeaderElection(
        enabled=True, lease_name="topoalloc-allocator", namespace=NS, identity=identity,
        lease_duration=1.0, renew_deadline=0.6, retry_period=0.1,
    )  # fmt: skip


@pytest.fixture
async def api(fake_api: FakeApiServer) -> AsyncIterator[KubeApi]:
    client = await KubeApi.connect(host=fake_api.url)
    yield client
    await client.close()


class Candidate:
    def __init__(self, api: KubeApi, identity: str) -> None:
        self.changes: list[bool] = []
        self.elector = LeaderElector(api, settings(identity), on_change=self.changes.append)
        self.task = asyncio.create_task(self.elector.run())

    async def kill(self) -> None:
        """Stop without releasing: a crashed process."""
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)

    async def shutdown(self) -> None:
        await self.kill()
        await self.elector.release()


async def test_exactly_one_leader_then_graceful_handover(fake_api: FakeApiServer, api: KubeApi) -> None:
    a, b = Candidate(api, "allocator-a"), Candidate(api, "allocator-b")
    try:
        await until(lambda: a.elector.is_leader or b.elector.is_leader)
        await asyncio.sleep(0.5)  # several renew periods: the other must not grab it
        assert a.elector.is_leader != b.elector.is_leader
        leader, standby = (a, b) if a.elector.is_leader else (b, a)
        lease = fake_api.get("leases", "topoalloc-allocator", NS)
        assert lease["spec"]["holderIdentity"] == leader.elector.identity
        assert lease["spec"]["renewTime"].endswith("Z") and len(lease["spec"]["renewTime"]) == 27
        assert standby.elector.holder == leader.elector.identity
        transitions = lease["spec"]["leaseTransitions"]
        await leader.shutdown()
        # Released: the standby takes over at its next retry, not after the lease duration.
        took = await until(lambda: standby.elector.is_leader)
        assert took < 0.6
        lease = fake_api.get("leases", "topoalloc-allocator", NS)
        assert lease["spec"]["holderIdentity"] == standby.elector.identity
        assert lease["spec"]["leaseTransitions"] == transitions + 1
        assert leader.changes == [True, False]
    finally:
        await a.kill()
        await b.kill()


async def test_crashed_leader_is_replaced_after_the_lease_expires(
    fake_api: FakeApiServer, api: KubeApi
) -> None:
    a = Candidate(api, "allocator-a")
    await until(lambda: a.elector.is_leader)
    b = Candidate(api, "allocator-b")
    try:
        await asyncio.sleep(0.3)
        assert not b.elector.is_leader
        await a.kill()
        took = await until(lambda: b.elector.is_leader)
        assert 0.5 < took < 2.5  # the lease (1 s) had to run out first, measured from b's view
    finally:
        await a.kill()
        await b.kill()


async def test_leader_that_cannot_renew_steps_down(fake_api: FakeApiServer, api: KubeApi) -> None:
    a = Candidate(api, "allocator-a")
    try:
        await until(lambda: a.elector.is_leader)
        fake_api.inject_fault("PUT", "/leases/", status=500, times=None)
        # It stops acting as leader once its last renewal is renew_deadline (0.6 s) old, before
        # the lease (1 s) can expire for anyone else; the loop then reports the loss.
        took = await until(lambda: not a.elector.is_leader)
        assert took <= 0.75
        await until(lambda: a.changes == [True, False], timeout=1.0)
        fake_api.clear_faults()
        await until(lambda: a.elector.is_leader)
    finally:
        await a.kill()


async def test_concurrent_takeover_has_one_winner(fake_api: FakeApiServer, api: KubeApi) -> None:
    # Five candidates start together against no Lease: the create conflicts and the PUT
    # preconditions leave exactly one leader.
    candidates = [Candidate(api, f"allocator-{i}") for i in range(5)]
    try:
        await until(lambda: any(c.elector.is_leader for c in candidates))
        for _ in range(20):
            assert sum(c.elector.is_leader for c in candidates) == 1
            await asyncio.sleep(0.05)
    finally:
        for c in candidates:
            await c.kill()
