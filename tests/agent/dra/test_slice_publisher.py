"""The node's ResourceSlices on the fake API server: written when the pool changes and only then,
one generation for all slices of the pool, stale slices deleted, slices others deleted put back."""

from __future__ import annotations

import copy
from typing import Any

from agent.dra.slice_publisher import WHOLE_GPUS_REASON, SlicePublisher
from agent.dra.slices import pool_devices, pool_slices, untainted, whole
from agent.kube import Kube
from apis import dra
from apis.dra_taints import NO_SCHEDULE, UNHEALTHY_KEY
from tests.agent.dra.rig import serve_resource_api
from tests.agent.support import FIXTURES, one_pass
from tests.support.fakeapi import discovery

NODE = "pub-node"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def ours(server) -> list[dict[str, Any]]:
    return sorted(
        (s for s in server.list_objects("resourceslices") if s["spec"]["nodeName"] == NODE),
        key=lambda s: s["metadata"]["name"],
    )


def writes(server) -> int:
    return sum(
        1 for r in server.requests() if "resourceslices" in r.path and r.method in ("POST", "PUT", "DELETE")
    )


def devices(**vfs: int) -> list[dict[str, Any]]:
    device = one_pass(FIXTURES / "dgx-h100", node=NODE).device
    return pool_devices(device, max_vfs=vfs.get("max_vfs", 8))


def test_written_once_then_only_on_change(fake_api_thread, fake_api_sync_client) -> None:
    server = fake_api_thread
    serve_resource_api(server)
    clock = Clock()
    pub = SlicePublisher(Kube(fake_api_sync_client), NODE, verify_seconds=60, clock=clock)
    pool = devices()
    assert pub.publish(pool, "node-uid").wrote
    (piece,) = ours(server)
    assert piece["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    assert (
        piece["spec"]["driver"] == dra.DRIVER and piece["metadata"]["ownerReferences"][0]["uid"] == "node-uid"
    )
    assert len(piece["spec"]["devices"]) == len(pool)
    before = writes(server)
    assert not pub.publish(pool, "node-uid").wrote  # same pool: not even read
    clock.t += 61
    assert not pub.publish(list(pool), "node-uid").wrote  # verified against the server: equal, not written
    assert writes(server) == before
    # a device turns unhealthy: it leaves, the generation goes up
    fewer = [d for d in pool if d["name"] != "gpu-3"]
    assert pub.publish(fewer, "node-uid").wrote
    (piece,) = ours(server)
    assert piece["spec"]["pool"]["generation"] == 2 and "gpu-3" not in {
        d["name"] for d in piece["spec"]["devices"]
    }


def test_a_restarted_agent_keeps_the_generation_of_an_equal_pool(
    fake_api_thread, fake_api_sync_client
) -> None:
    server = fake_api_thread
    serve_resource_api(server)
    kube = Kube(fake_api_sync_client)
    pool = devices()
    SlicePublisher(kube, NODE).publish(pool, "u")
    SlicePublisher(kube, NODE).publish(pool[:-1], "u")  # generation 2
    again = SlicePublisher(kube, NODE)
    assert not again.publish(pool[:-1], "u").wrote
    assert again.generation == 2
    assert again.publish(pool, "u").wrote
    assert ours(server)[0]["spec"]["pool"]["generation"] == 3


def test_a_pool_over_128_devices_is_several_slices_of_one_generation(
    fake_api_thread, fake_api_sync_client
) -> None:
    server = fake_api_thread
    serve_resource_api(server)
    pub = SlicePublisher(Kube(fake_api_sync_client), NODE)
    gpu = devices()[0]
    big = [dict(gpu, name=f"gpu-{i}") for i in range(300)]
    pub.publish(big, "u")
    slices = ours(server)
    assert [len(s["spec"]["devices"]) for s in slices] == [128, 128, 44]
    assert {(s["spec"]["pool"]["generation"], s["spec"]["pool"]["resourceSliceCount"]) for s in slices} == {
        (1, 3)
    }
    # shrinking to one slice updates that one at a new generation and deletes the other two
    pub.publish(big[:100], "u")
    (left,) = ours(server)
    assert left["spec"]["pool"] == {"name": NODE, "generation": 2, "resourceSliceCount": 1}


def test_deleted_or_changed_slices_are_put_back(fake_api_thread, fake_api_sync_client) -> None:
    server = fake_api_thread
    serve_resource_api(server)
    clock = Clock()
    pub = SlicePublisher(Kube(fake_api_sync_client), NODE, clock=clock)
    pool = devices()
    pub.publish(pool, "u")
    (piece,) = ours(server)
    server.remove("resourceslices", piece["metadata"]["name"])  # kubelet wipes a node's slices on start
    pub.mark_stale()  # the plugin registered again
    assert pub.publish(pool, "u").wrote
    (back,) = ours(server)
    # every write moves the pool on: a scheduler that saw generation 1 knows this is newer
    assert back["spec"]["pool"]["generation"] == 2 and len(back["spec"]["devices"]) == len(pool)
    # someone edits it: the next verification restores it at a new generation
    back["spec"]["devices"] = back["spec"]["devices"][:1]
    server.put(back)
    clock.t += 61
    assert pub.publish(pool, "u").wrote
    (fixed,) = ours(server)
    assert len(fixed["spec"]["devices"]) == len(pool) and fixed["spec"]["pool"]["generation"] == 3
    # another node's slice of the same driver is none of its business
    other = pool_slices("other", pool[:1], 5)[0]
    server.put(other)
    clock.t += 61
    assert not pub.publish(pool, "u").wrote
    assert server.get("resourceslices", other["metadata"]["name"]) is not None


def test_an_api_failure_is_reported_and_retried(fake_api_thread, fake_api_sync_client) -> None:
    server = fake_api_thread
    pub = SlicePublisher(Kube(fake_api_sync_client), NODE)
    out = pub.publish(devices(), "u")  # the resource API is not served yet: 404 on the list
    assert out.error.startswith(f"ResourceSlices of {NODE}: HTTP 404")
    serve_resource_api(server)
    assert pub.publish(devices(), "u").wrote


def tainted_pool() -> list[dict[str, Any]]:
    """The DGX H100's pool with its NICs whose ports are down kept, tainted NoSchedule."""
    device = one_pass(FIXTURES / "dgx-h100", node=NODE).device
    return pool_devices(device, max_vfs=8, taint_effect=NO_SCHEDULE)


def test_a_server_of_1_36_keeps_unhealthy_devices_tainted(
    fake_api_thread, fake_api_sync_client, monkeypatch
) -> None:
    server = fake_api_thread
    serve_resource_api(server)
    monkeypatch.setitem(discovery.VERSION_INFO, "minor", "36")
    pub = SlicePublisher(Kube(fake_api_sync_client), NODE)
    pool = tainted_pool()
    assert pub.publish(pool, "u").wrote and pub.taints is True
    stored = {d["name"]: d for s in ours(server) for d in s["spec"]["devices"]}
    assert set(stored) == {d["name"] for d in pool}
    sick = [n for n, d in stored.items() if d.get("taints")]
    assert sick and all(stored[n]["taints"][0]["key"] == UNHEALTHY_KEY for n in sick)
    before = writes(server)
    clock_pub = SlicePublisher(Kube(fake_api_sync_client), NODE, taints=True)
    assert not clock_pub.publish(pool, "u").wrote  # an equal pool, taints and all: nothing written
    assert writes(server) == before


def test_a_server_before_1_36_loses_the_unhealthy_devices(fake_api_thread, fake_api_sync_client) -> None:
    server = fake_api_thread
    serve_resource_api(server)  # the fake server says v1.32
    pub = SlicePublisher(Kube(fake_api_sync_client), NODE)
    pool = tainted_pool()
    assert pub.publish(pool, "u").wrote and pub.taints is False
    stored = [d for s in ours(server) for d in s["spec"]["devices"]]
    assert [d["name"] for d in stored] == [d["name"] for d in untainted(pool)] and len(stored) < len(pool)
    assert not any(d.get("taints") for d in stored)


class DroppingTaints(Kube):
    """A server that drops device taints on write (DRADeviceTaints turned off on a 1.36 server)."""

    def _strip(self, body: dict[str, Any]) -> dict[str, Any]:
        body = copy.deepcopy(body)
        for dev in body["spec"]["devices"]:
            dev.pop("taints", None)
        return body

    def create_resource_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        return super().create_resource_slice(self._strip(body))

    def replace_resource_slice(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return super().replace_resource_slice(name, self._strip(body))


def test_taints_dropped_by_the_server_fall_back_to_removal(fake_api_thread, fake_api_sync_client) -> None:
    server = fake_api_thread
    serve_resource_api(server)
    pub = SlicePublisher(DroppingTaints(fake_api_sync_client), NODE, taints=True)
    pool = tainted_pool()
    assert pub.publish(pool, "u").wrote and pub.taints is False
    (piece,) = ours(server)
    assert [d["name"] for d in piece["spec"]["devices"]] == [d["name"] for d in untainted(pool)]
    assert piece["spec"]["pool"]["generation"] == 2  # written again at once, without them


def whole_events(server) -> list[dict[str, Any]]:
    return [e for e in server.list_objects("events") if e.get("reason") == WHOLE_GPUS_REASON]


def test_a_server_of_1_36_keeps_the_gpus_sharable(fake_api_thread, fake_api_sync_client, monkeypatch) -> None:
    server = fake_api_thread
    serve_resource_api(server)
    monkeypatch.setitem(discovery.VERSION_INFO, "minor", "36")
    pub = SlicePublisher(Kube(fake_api_sync_client), NODE)
    pool = devices()
    assert pub.publish(pool, "u").wrote and pub.sharing is True
    stored = {d["name"]: d for s in ours(server) for d in s["spec"]["devices"]}
    assert stored["gpu-0"][dra.ALLOW_MULTIPLE] is True
    assert set(stored["gpu-0"]["capacity"]) == {dra.CAPACITY_MEMORY, dra.CAPACITY_CORES}
    assert not whole_events(server)
    before = writes(server)
    assert not SlicePublisher(Kube(fake_api_sync_client), NODE).publish(pool, "u").wrote  # equal: nothing
    assert writes(server) == before


def test_a_server_before_1_36_gets_whole_gpus_and_the_node_is_told_once(
    fake_api_thread, fake_api_sync_client
) -> None:
    server = fake_api_thread
    serve_resource_api(server)  # the fake server says v1.32
    pub = SlicePublisher(Kube(fake_api_sync_client), NODE)
    pool = devices()
    assert pub.publish(pool, "node-uid").wrote and pub.sharing is False
    stored = [d for s in ours(server) for d in s["spec"]["devices"]]
    assert stored == whole(pool) and not any(dra.ALLOW_MULTIPLE in d for d in stored)
    (event,) = whole_events(server)
    assert event["type"] == "Warning" and event["metadata"]["namespace"] == "default"
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "node-uid"}
    assert "published whole only" in event["message"] and "(1.32)" in event["message"]
    pub.mark_stale()
    pub.publish(pool[:-1], "node-uid")  # another pass, another write: told once is enough
    assert len(whole_events(server)) == 1


class DroppingSharing(Kube):
    """A server that drops consumable capacity on write (DRAConsumableCapacity off on 1.36)."""

    def _strip(self, body: dict[str, Any]) -> dict[str, Any]:
        body = copy.deepcopy(body)
        for dev in body["spec"]["devices"]:
            dev.pop(dra.ALLOW_MULTIPLE, None)
            for cap in (dev.get("capacity") or {}).values():
                cap.pop("requestPolicy", None)
        return body

    def create_resource_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        return super().create_resource_slice(self._strip(body))

    def replace_resource_slice(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return super().replace_resource_slice(name, self._strip(body))


def test_sharing_dropped_by_the_server_falls_back_to_whole_gpus(
    fake_api_thread, fake_api_sync_client
) -> None:
    server = fake_api_thread
    serve_resource_api(server)
    pub = SlicePublisher(DroppingSharing(fake_api_sync_client), NODE, taints=False, sharing=True)
    pool = devices()
    assert pub.publish(pool, "u").wrote and pub.sharing is False
    (piece,) = ours(server)
    assert piece["spec"]["devices"] == whole(pool)  # no cores capacity left behind either
    assert piece["spec"]["pool"]["generation"] == 2  # written again at once, whole
    (event,) = whole_events(server)
    assert "dropped allowMultipleAllocations" in event["message"]
