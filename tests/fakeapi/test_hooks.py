"""Test hooks: fault injection, the request log, direct object access, CRD registration, threads."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import aiohttp
import pytest
from kubernetes import client as sync_client
from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException
from kubernetes.client.exceptions import ApiException as SyncApiException

from tests.support.fakeapi import FakeApiServer

from .manifests import node, pod
from .streams import until_end


async def test_fault_answers_the_next_matching_requests(
    fake_api: FakeApiServer, fake_api_aio_client: Any
) -> None:
    core = client.CoreV1Api(fake_api_aio_client)
    fault = fake_api.inject_fault("GET", r"^/api/v1/nodes$", status=500, times=2)
    for _ in range(2):
        with pytest.raises(ApiException) as err:
            await core.list_node()
        assert err.value.status == 500
        assert json.loads(err.value.body) == {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "injected fault: HTTP 500",
            "reason": "InternalError",
            "details": {},
            "code": 500,
        }
    assert (await core.list_node()).items == []
    assert fault.hits == 2 and fault.times == 0


async def test_fault_only_on_watches(fake_api: FakeApiServer, fake_api_aio_client: Any) -> None:
    core = client.CoreV1Api(fake_api_aio_client)
    fake_api.inject_fault(path=r"/pods$", watch=True, status=503, times=None, headers={"Retry-After": "1"})
    await core.list_namespaced_pod("default")  # LIST is untouched
    for _ in range(3):
        response = await core.list_namespaced_pod_without_preload_content("default", watch=True)
        assert (response.status, response.headers["Retry-After"]) == (503, "1")
        response.release()
    fake_api.clear_faults()
    response = await core.list_namespaced_pod_without_preload_content(
        "default", watch=True, timeout_seconds=1
    )
    assert response.status == 200
    assert await until_end(response) == []


async def test_fault_with_a_custom_body_and_a_delay(
    fake_api: FakeApiServer, fake_api_aio_client: Any
) -> None:
    fake_api.put(node("n1"))
    core = client.CoreV1Api(fake_api_aio_client)
    gone = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired", "code": 410}
    fake_api.inject_fault("GET", r"/nodes$", status=410, body=gone)
    with pytest.raises(ApiException) as err:
        await core.list_node()
    assert (err.value.status, json.loads(err.value.body)) == (410, gone)

    fake_api.inject_fault("GET", r"/nodes/n1$", delay=0.3)  # no status: answered normally, late
    loop = asyncio.get_running_loop()
    began = loop.time()
    assert (await core.read_node("n1")).metadata.name == "n1"
    assert loop.time() - began >= 0.3


async def test_fault_that_drops_the_connection(fake_api: FakeApiServer, fake_api_aio_client: Any) -> None:
    # aiohttp retries an idempotent request once when a kept-alive connection drops: fail twice.
    fake_api.inject_fault("GET", r"/nodes$", disconnect=True, times=2)
    with pytest.raises(aiohttp.ClientError):
        await client.CoreV1Api(fake_api_aio_client).list_node()
    assert [r.status for r in fake_api.requests("GET", "/api/v1/nodes")] == [0, 0]
    assert (await client.CoreV1Api(fake_api_aio_client).list_node()).items == []


async def test_request_log(fake_api: FakeApiServer, fake_api_aio_client: Any) -> None:
    core = client.CoreV1Api(fake_api_aio_client)
    await core.create_namespaced_pod("default", pod("p"))
    await core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"a": "b"}}})
    with pytest.raises(ApiException):
        await core.read_namespaced_pod("missing", "default")
    log = fake_api.requests()
    assert [(r.method, r.path, r.status) for r in log] == [
        ("POST", "/api/v1/namespaces/default/pods", 201),
        ("PATCH", "/api/v1/namespaces/default/pods/p", 200),
        ("GET", "/api/v1/namespaces/default/pods/missing", 404),
    ]
    assert log[1].body == {"metadata": {"labels": {"a": "b"}}}
    assert log[1].content_type == "application/strategic-merge-patch+json"
    assert fake_api.requests("PATCH")[0].path == "/api/v1/namespaces/default/pods/p"
    fake_api.clear_requests()
    assert fake_api.requests() == []


async def test_direct_object_access(fake_api: FakeApiServer, fake_api_aio_client: Any) -> None:
    seeded = fake_api.put({**pod("running", node="n1"), "status": {"phase": "Running"}})
    assert seeded["status"] == {"phase": "Running"}  # a given status is kept when seeding
    assert seeded["spec"]["schedulerName"] == "default-scheduler"  # defaults still apply
    read = await client.CoreV1Api(fake_api_aio_client).read_namespaced_pod("running", "default")
    assert read.status.phase == "Running"

    updated = fake_api.put({**pod("running", node="n1"), "status": {"phase": "Succeeded"}})
    assert updated["metadata"]["uid"] == seeded["metadata"]["uid"]
    assert int(updated["metadata"]["resourceVersion"]) > int(seeded["metadata"]["resourceVersion"])

    copy = fake_api.get("pods", "running", "default")
    assert copy is not None
    copy["status"]["phase"] = "mutated"  # a copy: the store is untouched
    assert fake_api.get("pods", "running", "default")["status"]["phase"] == "Succeeded"  # type: ignore[index]
    assert fake_api.remove("pods", "running", "default") is not None
    assert fake_api.get("pods", "running", "default") is None
    assert fake_api.remove("pods", "running", "default") is None


async def test_register_a_crd(fake_api: FakeApiServer, fake_api_aio_client: Any) -> None:
    fake_api.register_crd("example.com", "v1", "widgets", "Widget", namespaced=True, short_names=("wd",))
    custom = client.CustomObjectsApi(fake_api_aio_client)
    body = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {"size": 1}}
    created = await custom.create_namespaced_custom_object("example.com", "v1", "default", "widgets", body)
    assert created["metadata"]["generation"] == 1
    assert fake_api.get("widgets", "w", "default") is not None
    resources = await custom.get_api_resources("example.com", "v1")
    assert [r.name for r in resources.resources] == ["widgets", "widgets/status"]
    with pytest.raises(ValueError, match="already registered"):
        fake_api.register_crd("example.com", "v1", "widgets", "Widget", namespaced=True)


def test_hooks_work_from_any_thread(fake_api_thread: FakeApiServer, fake_api_sync_client: Any) -> None:
    """The threaded server's hooks run on its own loop whichever thread calls them."""
    core = sync_client.CoreV1Api(fake_api_sync_client)
    errors: list[BaseException] = []

    def seed(first: int) -> None:
        try:
            for i in range(first, first + 20):
                fake_api_thread.put(node(f"n{i:02d}"))
        except BaseException as exc:  # reported to the test thread below
            errors.append(exc)

    threads = [threading.Thread(target=seed, args=(k * 20,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert errors == []
    assert len(core.list_node().items) == 60
    assert fake_api_thread.resource_version == core.list_node().metadata.resource_version


def test_threaded_fault_and_watch_count(fake_api_thread: FakeApiServer, fake_api_sync_client: Any) -> None:
    core = sync_client.CoreV1Api(fake_api_sync_client)
    fake_api_thread.inject_fault("GET", r"/nodes$", status=429, reason="TooManyRequests", message="slow down")
    with pytest.raises(SyncApiException) as err:
        core.list_node()
    assert (err.value.status, json.loads(err.value.body)["message"]) == (429, "slow down")

    done = threading.Event()

    def watch_nodes() -> None:
        response = core.list_node(watch=True, timeout_seconds=5, _preload_content=False)
        response.read()  # until the server ends the stream
        done.set()

    watcher = threading.Thread(target=watch_nodes, daemon=True)
    watcher.start()
    fake_api_thread.wait_for_watches_blocking(1, "nodes")
    assert fake_api_thread.watch_count("pods") == 0
    # An open watch is in the request log as soon as its stream starts.
    assert [r.status for r in fake_api_thread.requests("GET", "/api/v1/nodes", watch=True)] == [200]
    began = time.monotonic()
    assert fake_api_thread.break_watches() == 1
    assert done.wait(5) and time.monotonic() - began < 2
    watcher.join(5)
