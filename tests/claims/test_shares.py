"""GPU shares on DRA through the claims controller, with the real allocator against the fake API
server: two shares on one GPU, a third that would exceed it waits with an Event, a whole GPU and a
share exclude each other, shares kube-scheduler allocated count as what they consume, and a node
whose GPUs are published whole only refuses a share saying so."""

from __future__ import annotations

from typing import Any

from agent.dra.slices import pool_devices, pool_slices, whole
from apis import dra
from apis.device import Device
from tests.claims.harness import (
    CLAIMS,
    allocation,
    claims_world,
    dra_node,
    events,
    gates,
    make_claims,
    serve_dra,
)
from tests.claims.objects import claim, claim_pod, gpus, template
from tests.support.fakeapi import FakeApiServer
from tests.support.machines import machine_device
from tests.support.pki import Pki
from tests.support.polling import until

JSON = dict[str, Any]
SELECTOR = {
    "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]
}


def sharable_node(
    fake: FakeApiServer, name: str = "n1", gpus_published: tuple[str, ...] = ("gpu-0",)
) -> None:
    """A DRA-mode DGX H100 whose pool publishes only `gpus_published` of its GPUs, sharable as the
    agent publishes them on 1.36 (allowMultipleAllocations, memory and cores with their policies)."""
    dra_node(fake, name)
    device = machine_device("dgx-h100", name)
    devices = [
        d
        for d in pool_devices(Device.from_dict(device), max_vfs=8)
        if not d["name"].startswith("gpu-") or d["name"] in gpus_published
    ]
    assert all(d[dra.ALLOW_MULTIPLE] for d in devices if d["name"].startswith("gpu-"))
    for s in pool_slices(name, devices, 1):
        s["spec"]["pool"]["generation"] = 2  # the newest generation: these slices are the pool
        fake.put(s)


def share(cores: str | None = None, memory: str | None = None) -> JSON:
    requests = {k: v for k, v in ((dra.CAPACITY_CORES, cores), (dra.CAPACITY_MEMORY, memory)) if v}
    exactly = {"deviceClassName": dra.GPU_CLASS, "capacity": {"requests": requests}}
    return {"requests": [{"name": "gpu", "exactly": exactly}]}


def results(fake: FakeApiServer, name: str) -> list[JSON]:
    return list(((allocation(fake, name) or {}).get("devices") or {}).get("results") or [])


async def test_two_shares_on_one_gpu_a_third_waits_and_whole_excludes_share(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    serve_dra(fake_api)
    sharable_node(fake_api)
    fake_api.put(template("half", share("50", "30Gi")))
    fake_api.put(template("tenth", share("10", "1Gi")))
    fake_api.put(template("whole", gpus(1)))
    async with claims_world(fake_api, pki) as w:
        await until(lambda: "n1" in w.run.service.cache.dra.published, what="n1's pool")
        for pod in ("a", "b"):
            await w.create_pod(claim_pod(pod, templates={"gpu": "half"}))
            make_claims(fake_api, pod)
            await until(lambda pod=pod: not gates(fake_api, pod), what=f"{pod} ungated")
        a, b = results(fake_api, "a-gpu"), results(fake_api, "b-gpu")
        assert [r["device"] for r in a + b] == ["gpu-0", "gpu-0"]
        for r in a + b:
            assert r["consumedCapacity"] == {"cores": "50", "memory": "30Gi"}
        assert a[0]["shareID"] != b[0]["shareID"] and all(len(r["shareID"]) == 36 for r in a + b)
        # 100 cores used: a third share waits, and so does a whole GPU
        for pod, tmpl in (("c", "tenth"), ("d", "whole")):
            await w.create_pod(claim_pod(pod, templates={"gpu": tmpl}))
            make_claims(fake_api, pod)
        await until(lambda: len(events(fake_api, "DRAAllocationFailed")) >= 2, what="both wait with Events")
        assert any("10% compute" in e for e in events(fake_api, "DRAAllocationFailed"))
        await w.looked_at("c", ["c-gpu"])
        for pod in ("c", "d"):
            assert (
                gates(fake_api, pod) == [dra.SCHEDULING_GATE] and allocation(fake_api, f"{pod}-gpu") is None
            )
        # a lets go: the third share fits beside b, the whole GPU still does not
        fake_api.remove(CLAIMS, "a-gpu", "default")
        await until(lambda: not gates(fake_api, "c"), what="c ungated once a's share is gone")
        assert results(fake_api, "c-gpu")[0]["consumedCapacity"] == {"cores": "10", "memory": "1Gi"}
        await w.looked_at("d", ["d-gpu"])
        assert allocation(fake_api, "d-gpu") is None


async def test_a_share_kube_scheduler_allocated_counts_as_what_it_consumes(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    serve_dra(fake_api)
    sharable_node(fake_api)
    fake_api.put(template("half", share("50", "10Gi")))
    fake_api.put(template("forty", share("40", "10Gi")))
    theirs = claim(
        "theirs", share("60"), annotations={dra.ALLOCATOR_ANNOTATION: dra.ALLOCATOR_KUBE_SCHEDULER}
    )
    async with claims_world(fake_api, pki) as w:
        await until(lambda: "n1" in w.run.service.cache.dra.published)
        fake_api.put(theirs)
        obj = fake_api.get(CLAIMS, "theirs", "default")
        assert obj is not None
        result = {
            "request": "gpu",
            "driver": dra.DRIVER,
            "pool": "n1",
            "device": "gpu-0",
            "shareID": "5b0d8a3e-2f57-4a43-9d1e-6c1d3a1f0c11",
            "consumedCapacity": {"cores": "60", "memory": "1Mi"},
        }
        obj["status"] = {"allocation": {"devices": {"results": [result]}, "nodeSelector": SELECTOR}}
        fake_api.put(obj)
        await w.create_pod(claim_pod("p", templates={"gpu": "half"}))
        make_claims(fake_api, "p")
        await until(lambda: events(fake_api, "DRAAllocationFailed"), what="50 cores do not fit beside 60")
        assert allocation(fake_api, "p-gpu") is None
        await w.create_pod(claim_pod("q", templates={"gpu": "forty"}))
        make_claims(fake_api, "q")
        await until(lambda: not gates(fake_api, "q"), what="40 cores fit beside 60")
        assert results(fake_api, "q-gpu")[0]["device"] == "gpu-0"


async def test_a_node_publishing_whole_gpus_refuses_a_share_saying_so(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    serve_dra(fake_api)
    dra_node(fake_api, "n1")
    devices = whole(pool_devices(Device.from_dict(machine_device("dgx-h100", "n1")), max_vfs=8))
    for s in pool_slices("n1", devices, 1):  # as the agent publishes them for 1.35
        s["spec"]["pool"]["generation"] = 2
        fake_api.put(s)
    fake_api.put(template("half", share("50", "10Gi")))
    async with claims_world(fake_api, pki) as w:
        await until(lambda: "n1" in w.run.service.cache.dra.published)
        await w.create_pod(claim_pod("p", templates={"gpu": "half"}))
        make_claims(fake_api, "p")
        await until(lambda: events(fake_api, "DRAAllocationFailed"), what="the refusal")
        (note,) = events(fake_api, "DRAAllocationFailed")[:1]
        assert "whole only" in note, note
        assert gates(fake_api, "p") == [dra.SCHEDULING_GATE] and allocation(fake_api, "p-gpu") is None
