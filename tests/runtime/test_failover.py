"""Two allocators against one API server: only the leader is ready, labelled and binding; when it
goes away (shut down, or killed) the standby takes over with the old leader's allocations intact."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import yaml

from allocator.runtime.config import LeaderElection
from allocator.runtime.leader import LEADER_LABEL
from tests.support.allocator_harness import (
    SchedulerClient,
    allocator_process,
    double_booked,
    pod,
    running_allocator,
    seed_nodes,
)
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Pki
from tests.support.polling import until

NS = "kube-system"


def election(identity: str) -> LeaderElection:
    return LeaderElection(
        namespace=NS, identity=identity, lease_duration=1.0, renew_deadline=0.6, retry_period=0.1,
        label_pod=True, pod_name=identity,
    )  # fmt: skip


def allocator_pod(fake: FakeApiServer, name: str) -> None:
    """The allocator's own pod, which the leader labels."""
    fake.put({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
              "spec": {"containers": [{"name": "allocator", "image": "topoalloc"}]}})  # fmt: skip


def labelled(fake: FakeApiServer) -> set[str]:
    return {
        p["metadata"]["name"]
        for p in fake.list_objects("pods", NS)
        if (p["metadata"].get("labels") or {}).get(LEADER_LABEL) == "true"
    }


async def test_graceful_failover(fake_api: FakeApiServer, pki: Pki) -> None:
    nodes = seed_nodes(fake_api, ["gpu-1", "gpu-2"])
    for name in ("allocator-a", "allocator-b"):
        allocator_pod(fake_api, name)
    pods = [fake_api.put(pod(f"w-{i}", gpus=2)) for i in range(8)]
    async with running_allocator(fake_api, pki, leader_election=election("allocator-a")) as a:
        await until(lambda: a.service.is_leader())
        async with running_allocator(fake_api, pki, leader_election=election("allocator-b")) as b:
            await asyncio.sleep(0.3)  # several retry periods
            assert (await a.get("/readyz"))[0] == 200
            status, body = await b.get("/readyz")
            assert status == 503 and "leader: allocator-a" in body
            assert (await b.get("/syncz"))[0] == 200  # a hot standby, cache synced
            await until(lambda: labelled(fake_api) == {"allocator-a"})
            assert a.metric("topoalloc_leader") == 1 and b.metric("topoalloc_leader") == 0
            assert "not the leader" in await b.client.bind(pods[0], "gpu-1")
            for p in pods[:4]:
                assert await a.client.bind(p, "gpu-1") == ""
            await a.service.stop()  # releases the Lease and drops its label
            took = await until(lambda: b.service.is_leader(), timeout=3)
            assert took < 0.5  # released, so no lease expiry to wait for
            await until(lambda: labelled(fake_api) == {"allocator-b"})
            assert (await b.get("/readyz"))[0] == 200
            # The new leader knows gpu-1 is full: it has A's allocations from the annotations.
            assert (await b.client.filter(pods[4], nodes))["NodeNames"] == ["gpu-2"]
            for p in pods[4:]:
                assert await b.client.bind(p, "gpu-2") == ""
    assert double_booked(fake_api.list_objects("pods", "default")) == []


async def test_killed_leader_is_replaced(fake_api: FakeApiServer, pki: Pki, tmp_path: Path) -> None:
    nodes = seed_nodes(fake_api, ["gpu-1", "gpu-2"])
    for name in ("allocator-a", "allocator-b"):
        allocator_pod(fake_api, name)
    pods = [fake_api.put(pod(f"w-{i}", gpus=4)) for i in range(4)]
    config = tmp_path / "allocator.yaml"
    config.write_text(yaml.safe_dump({"leaderElection": {
        "namespace": NS, "identity": "allocator-a", "leaseDuration": 1.0, "renewDeadline": 0.6,
        "retryPeriod": 0.1, "labelPod": True,
    }}))  # fmt: skip
    async with allocator_process(
        fake_api, pki, "--config", str(config), env={"POD_NAME": "allocator-a"}
    ) as a:
        await a.ready()  # ready means synced and leading
        async with running_allocator(fake_api, pki, leader_election=election("allocator-b")) as b:
            client = SchedulerClient(f"https://127.0.0.1:{a.port}", pki)
            try:
                assert await client.bind(pods[0], "gpu-1") == ""
                assert await client.bind(pods[1], "gpu-1") == ""
            finally:
                await client.close()
            await until(lambda: labelled(fake_api) == {"allocator-a"})
            assert not b.service.is_leader()
            a.proc.send_signal(signal.SIGKILL)
            await a.proc.wait()
            # No release: B waits out the lease (1 s, counted from its own last sighting).
            took = await until(lambda: b.service.is_leader(), timeout=5)
            assert 0.3 < took < 3.0
            await until(lambda: "allocator-b" in labelled(fake_api))
            assert (await b.get("/readyz"))[0] == 200
            assert (await b.client.filter(pods[2], nodes))["NodeNames"] == ["gpu-2"]
            assert await b.client.bind(pods[2], "gpu-2") == ""
            assert await b.client.bind(pods[3], "gpu-2") == ""
            assert "gpu-1" in await b.client.bind(fake_api.put(pod("extra", gpus=1)), "gpu-1")
    assert double_booked(fake_api.list_objects("pods", "default")) == []
