"""WATCH semantics through `kubernetes.aio` raw calls, as the allocator's reflector uses them."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from kubernetes.aio import client

from tests.support.fakeapi import FakeApiServer

from .manifests import DEVICES, device, pod
from .streams import events, next_event, summary, until_end


def _core(api: Any) -> client.CoreV1Api:
    return client.CoreV1Api(api)


async def _watch_pods(api: Any, namespace: str | None = "default", **params: Any) -> Any:
    core = _core(api)
    params.setdefault("timeout_seconds", 10)
    if namespace is None:
        return await core.list_pod_for_all_namespaces_without_preload_content(watch=True, **params)
    return await core.list_namespaced_pod_without_preload_content(namespace, watch=True, **params)


async def test_watch_from_zero_starts_with_synthetic_added(
    fake_api: FakeApiServer, fake_api_aio_client: Any
) -> None:
    fake_api.put(pod("a"))
    fake_api.put(pod("b"))
    for rv in ("0", None):
        response = await _watch_pods(fake_api_aio_client, resource_version=rv)
        first = await events(response, 2)
        assert summary(first) == [("ADDED", "a"), ("ADDED", "b")]
        assert all(e["object"]["kind"] == "Pod" and e["object"]["apiVersion"] == "v1" for e in first)
        fake_api.put(pod("c"))
        assert summary(await events(response, 1)) == [("ADDED", "c")]
        response.release()
        fake_api.remove("pods", "c", "default")


async def test_resume_replays_exactly_the_later_changes(
    fake_api: FakeApiServer, fake_api_aio_client: Any
) -> None:
    fake_api.put(pod("a"))
    start = fake_api.resource_version
    fake_api.put(pod("b"))
    fake_api.put(pod("elsewhere", "kube-system"))
    fake_api.put({**pod("a"), "metadata": {"name": "a", "namespace": "default", "labels": {"v": "2"}}})
    fake_api.remove("pods", "b", "default")
    response = await _watch_pods(fake_api_aio_client, resource_version=start)
    got = await events(response, 3)
    assert summary(got) == [("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "b")]
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in got]
    assert rvs == sorted(rvs) and rvs[0] > int(start)
    response.release()


async def test_resume_after_compaction_is_one_410_error_event(
    fake_api: FakeApiServer, fake_api_aio_client: Any
) -> None:
    fake_api.put(pod("a"))
    old = fake_api.resource_version
    fake_api.put(pod("b"))
    fake_api.compact()
    response = await _watch_pods(fake_api_aio_client, resource_version=old)
    assert response.status == 200
    got = await until_end(response)
    assert len(got) == 1 and got[0]["type"] == "ERROR"
    assert got[0]["object"] == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f"too old resource version: {old} ({fake_api.resource_version})",
        "reason": "Expired",
        "code": 410,
    }
    # From the compaction point on, resuming works again.
    response = await _watch_pods(fake_api_aio_client, resource_version=fake_api.resource_version)
    fake_api.put(pod("c"))
    assert summary(await events(response, 1)) == [("ADDED", "c")]
    response.release()


async def test_bounded_history_expires_old_resource_versions() -> None:
    async with FakeApiServer(history_limit=3) as server:
        server.put(pod("a"))
        start = server.resource_version
        for i in range(4):
            server.put(pod(f"p{i}"))
        async with server.aio_api_client() as api:
            response = await _watch_pods(api, resource_version=start)
            got = await until_end(response)
            assert got[0]["object"]["reason"] == "Expired"
            newest_kept = int(server.resource_version) - 3
            response = await _watch_pods(api, resource_version=str(newest_kept))
            assert summary(await events(response, 3)) == [("ADDED", "p1"), ("ADDED", "p2"), ("ADDED", "p3")]
            response.release()


async def test_selector_transitions_become_added_and_deleted(
    fake_api: FakeApiServer, fake_api_aio_client: Any
) -> None:
    """A pod entering a selector arrives as ADDED, one leaving it as DELETED (its previous state with the
    new resourceVersion), like the apiserver's watch cache does for the scheduler's unassigned-pod watch."""
    fake_api.put(pod("p"))
    unassigned = await _watch_pods(
        fake_api_aio_client, None, resource_version=fake_api.resource_version, field_selector="spec.nodeName="
    )
    on_node = await _watch_pods(
        fake_api_aio_client,
        None,
        resource_version=fake_api.resource_version,
        field_selector="spec.nodeName=n1",
    )
    labelled = await _watch_pods(fake_api_aio_client, label_selector="tier in (gpu)", resource_version="0")
    await fake_api.wait_for_watches(3, "pods")

    core = _core(fake_api_aio_client)
    await core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"tier": "gpu"}}})
    binding = client.V1Binding(
        metadata=client.V1ObjectMeta(name="p"), target=client.V1ObjectReference(name="n1")
    )
    bound = await core.create_namespaced_pod_binding_without_preload_content("p", "default", binding)
    assert bound.status == 201
    await core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"tier": "cpu"}}})

    left = await events(unassigned, 2)
    assert summary(left) == [("MODIFIED", "p"), ("DELETED", "p")]
    assert "nodeName" not in left[1]["object"]["spec"]  # the state before it left the selection
    assert int(left[1]["object"]["metadata"]["resourceVersion"]) > int(
        left[0]["object"]["metadata"]["resourceVersion"]
    )
    entered = await events(on_node, 2)
    assert summary(entered) == [("ADDED", "p"), ("MODIFIED", "p")]
    assert entered[0]["object"]["spec"]["nodeName"] == "n1"
    assert summary(await events(labelled, 3)) == [("ADDED", "p"), ("MODIFIED", "p"), ("DELETED", "p")]
    for response in (unassigned, on_node, labelled):
        response.release()


async def test_watch_on_one_object_by_name(fake_api: FakeApiServer, fake_api_aio_client: Any) -> None:
    fake_api.put(pod("mine"))
    fake_api.put(pod("other"))
    response = await _watch_pods(
        fake_api_aio_client, field_selector="metadata.name=mine", resource_version="0"
    )
    fake_api.put(pod("other", labels={"x": "1"}))
    fake_api.put(pod("mine", labels={"x": "1"}))
    assert summary(await events(response, 2)) == [("ADDED", "mine"), ("MODIFIED", "mine")]
    response.release()


async def test_no_bookmark_while_nothing_happened_after_the_start(
    fake_api: FakeApiServer, fake_api_aio_client: Any
) -> None:
    """Recorded behaviour (watch-pods-idle-no-bookmark): an idle watch gets no BOOKMARK."""
    fake_api.put(pod("a"))
    response = await _watch_pods(
        fake_api_aio_client,
        resource_version=fake_api.resource_version,
        allow_watch_bookmarks=True,
        timeout_seconds=1,
    )
    assert await until_end(response) == []


async def test_bookmark_advances_a_filtered_watch(fake_api: FakeApiServer, fake_api_aio_client: Any) -> None:
    """Changes the watch does not see still move its resourceVersion forward through BOOKMARKs."""
    fake_api.put(pod("a"))
    start = fake_api.resource_version
    response = await _watch_pods(fake_api_aio_client, resource_version=start, allow_watch_bookmarks=True)
    fake_api.put(pod("x", "kube-system"))
    bookmark = await next_event(response)
    assert bookmark is not None
    assert bookmark == {
        "type": "BOOKMARK",
        "object": {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": fake_api.resource_version, "creationTimestamp": None},
            "spec": {"containers": None},
            "status": {},
        },
    }
    response.release()


async def test_no_bookmarks_unless_asked(fake_api: FakeApiServer, fake_api_aio_client: Any) -> None:
    start = fake_api.resource_version
    response = await _watch_pods(fake_api_aio_client, resource_version=start, timeout_seconds=1)
    fake_api.put(pod("x", "kube-system"))
    assert await until_end(response) == []


async def test_pre_timeout_bookmark_and_timeout() -> None:
    """With the real one-minute interval, the one bookmark comes `bookmark_before_timeout` before the
    deadline (recorded at 18.6 s of a 20 s watch), then the server ends the stream."""
    async with FakeApiServer(bookmark_interval=60, bookmark_before_timeout=0.5) as server:
        server.put(pod("a"))
        start = server.resource_version
        async with server.aio_api_client() as api:
            response = await _watch_pods(
                api, resource_version=start, allow_watch_bookmarks=True, timeout_seconds=1
            )
            server.put(pod("x", "kube-system"))
            loop = asyncio.get_running_loop()
            began = loop.time()
            got = await until_end(response)
            elapsed = loop.time() - began
    assert summary(got) == [("BOOKMARK", "")]
    assert 0.8 <= elapsed < 2.5


async def test_custom_resource_watch_and_bookmark(fake_api: FakeApiServer, fake_api_aio_client: Any) -> None:
    custom = client.CustomObjectsApi(fake_api_aio_client)
    start = fake_api.resource_version
    response = await custom.list_cluster_custom_object_without_preload_content(
        *DEVICES, watch=True, resource_version=start, allow_watch_bookmarks=True, timeout_seconds=10
    )
    fake_api.put(device("node-1"))
    added = await next_event(response)
    bookmark = await next_event(response)
    assert added is not None and added["type"] == "ADDED"
    assert list(added["object"]) == ["apiVersion", "kind", "metadata", "spec"]  # unstructured: sorted keys
    assert bookmark == {
        "type": "BOOKMARK",
        "object": {
            "apiVersion": "scheduling.koordinator.sh/v1alpha1",
            "kind": "Device",
            "metadata": {"resourceVersion": fake_api.resource_version},
        },
    }
    response.release()


async def test_break_watches_ends_streams_cleanly(fake_api: FakeApiServer, fake_api_aio_client: Any) -> None:
    response = await _watch_pods(fake_api_aio_client, resource_version="0")
    await fake_api.wait_for_watches(1)
    assert fake_api.break_watches() == 1
    assert await until_end(response) == []
    assert fake_api.watch_count() == 0


async def test_break_watches_with_abort_drops_the_connection(
    fake_api: FakeApiServer, fake_api_aio_client: Any
) -> None:
    response = await _watch_pods(fake_api_aio_client, resource_version="0")
    await fake_api.wait_for_watches(1)
    fake_api.break_watches(abort=True)
    with pytest.raises(aiohttp.ClientPayloadError):
        await until_end(response)
    response.release()


async def test_watch_from_a_future_resource_version(
    fake_api: FakeApiServer, fake_api_aio_client: Any
) -> None:
    future = str(int(fake_api.resource_version) + 1)
    waiting = asyncio.create_task(_watch_pods(fake_api_aio_client, resource_version=future))
    await asyncio.sleep(0.05)
    fake_api.put(pod("arrives"))  # the store reaches `future` within the wait
    response = await waiting
    fake_api.put(pod("next"))
    assert summary(await events(response, 1)) == [("ADDED", "next")]
    response.release()

    too_far = str(int(fake_api.resource_version) + 100)
    response = await _watch_pods(fake_api_aio_client, resource_version=too_far)
    got = await until_end(response)
    assert [e["object"]["code"] for e in got] == [504]
    assert got[0]["object"]["details"]["causes"][0]["reason"] == "ResourceVersionTooLarge"


async def test_send_initial_events_is_refused_as_recorded(fake_api_aio_client: Any) -> None:
    response = await _watch_pods(
        fake_api_aio_client,
        send_initial_events=True,
        resource_version_match="NotOlderThan",
        allow_watch_bookmarks=True,
    )
    got = await until_end(response)
    assert [(e["type"], e["object"]["code"]) for e in got] == [("ERROR", 500)]


async def test_watch_param_spellings(fake_api: FakeApiServer) -> None:
    """The apiserver accepts any Go ParseBool spelling for `watch` (kubernetes_asyncio sends `True`)."""
    fake_api.put(pod("a"))
    async with aiohttp.ClientSession() as session:
        for spelling in ("true", "True", "1"):
            url = f"{fake_api.url}/api/v1/namespaces/default/pods?watch={spelling}&timeoutSeconds=1"
            async with session.get(url) as response:
                first = await next_event(response)
                assert first is not None and first["type"] == "ADDED"
        async with session.get(f"{fake_api.url}/api/v1/namespaces/default/pods?watch=maybe") as response:
            assert response.status == 400
