"""The official `kubernetes.aio` client against the fake on the test's own event loop."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from kubernetes.aio import client, watch
from kubernetes.aio.client.exceptions import ApiException

from tests.support.fakeapi import FakeApiServer

from .manifests import DEVICES, device, lease, node, pod, podgroup

# The namespaced custom-object calls take (group, version, namespace, plural, ...).
PODGROUPS_IN_DEFAULT = ("scheduling.x-k8s.io", "v1alpha1", "default", "podgroups")


async def test_pod_crud_and_conflicts(fake_api_aio_client: Any) -> None:
    core = client.CoreV1Api(fake_api_aio_client)
    created = await core.create_namespaced_pod("default", pod("p1", labels={"app": "a"}))
    assert created.status.qos_class == "BestEffort"
    with pytest.raises(ApiException) as err:
        await core.create_namespaced_pod("default", pod("p1"))
    assert err.value.status == 409
    stale = await core.read_namespaced_pod("p1", "default")
    await core.patch_namespaced_pod("p1", "default", {"metadata": {"annotations": {"k": "v"}}})
    stale.metadata.labels["x"] = "y"
    with pytest.raises(ApiException) as err:
        await core.replace_namespaced_pod("p1", "default", stale)
    assert err.value.status == 409
    assert json.loads(err.value.body)["reason"] == "Conflict"


async def test_custom_resources_crud_and_status(fake_api_aio_client: Any) -> None:
    custom = client.CustomObjectsApi(fake_api_aio_client)
    await custom.create_cluster_custom_object(*DEVICES, device("node-1"))
    await custom.create_namespaced_custom_object(*PODGROUPS_IN_DEFAULT, podgroup("gang"))
    status = await custom.patch_namespaced_custom_object_status(
        *PODGROUPS_IN_DEFAULT, "gang", {"status": {"phase": "Scheduling", "scheduled": 1}}
    )
    assert status["status"] == {"phase": "Scheduling", "scheduled": 1}
    # A main write cannot touch status; a status write cannot touch spec.
    spec_write = await custom.patch_namespaced_custom_object(
        *PODGROUPS_IN_DEFAULT, "gang", {"spec": {"minMember": 3}, "status": {"phase": "Running"}}
    )
    assert spec_write["spec"]["minMember"] == 3
    assert spec_write["status"]["phase"] == "Scheduling"
    status_write = await custom.patch_namespaced_custom_object_status(
        *PODGROUPS_IN_DEFAULT, "gang", {"spec": {"minMember": 9}, "status": {"phase": "Running"}}
    )
    assert (status_write["spec"]["minMember"], status_write["status"]["phase"]) == (3, "Running")
    listed = await custom.list_namespaced_custom_object(*PODGROUPS_IN_DEFAULT)
    assert listed["kind"] == "PodGroupList"
    assert [i["kind"] for i in listed["items"]] == ["PodGroup"]  # custom list items keep their kind
    await custom.delete_cluster_custom_object(*DEVICES, "node-1")
    with pytest.raises(ApiException) as err:
        await custom.get_cluster_custom_object(*DEVICES, "node-1")
    assert json.loads(err.value.body)["message"] == 'devices.scheduling.koordinator.sh "node-1" not found'


async def test_replace_of_a_custom_resource_requires_a_resource_version(fake_api_aio_client: Any) -> None:
    custom = client.CustomObjectsApi(fake_api_aio_client)
    created = await custom.create_cluster_custom_object(*DEVICES, device("node-1"))
    del created["metadata"]["resourceVersion"]
    with pytest.raises(ApiException) as err:
        await custom.replace_cluster_custom_object(*DEVICES, "node-1", created)
    body = json.loads(err.value.body)
    assert err.value.status == 422
    assert body["message"] == (
        'devices.scheduling.koordinator.sh "node-1" is invalid: '
        "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update"
    )
    assert body["details"]["causes"][0]["field"] == "metadata.resourceVersion"


async def test_strategic_merge_patch_is_415_on_custom_resources(fake_api_aio_client: Any) -> None:
    custom = client.CustomObjectsApi(fake_api_aio_client)
    await custom.create_cluster_custom_object(*DEVICES, device("node-1"))
    with pytest.raises(ApiException) as err:
        await custom.patch_cluster_custom_object(
            *DEVICES, "node-1", {"spec": {}}, _content_type="application/strategic-merge-patch+json"
        )
    assert err.value.status == 415
    assert json.loads(err.value.body)["reason"] == "UnsupportedMediaType"


async def test_binding_without_preload_content(fake_api: FakeApiServer, fake_api_aio_client: Any) -> None:
    """The raw call does not raise on errors: the status code is the answer."""
    core = client.CoreV1Api(fake_api_aio_client)
    await core.create_namespaced_pod("default", pod("p1"))
    binding = client.V1Binding(
        metadata=client.V1ObjectMeta(name="p1"), target=client.V1ObjectReference(kind="Node", name="n1")
    )
    first = await core.create_namespaced_pod_binding_without_preload_content("p1", "default", binding)
    assert first.status == 201
    second = await core.create_namespaced_pod_binding_without_preload_content("p1", "default", binding)
    assert second.status == 409
    assert (await second.json())["reason"] == "Conflict"
    binding.metadata.name = "nope"
    missing = await core.create_namespaced_pod_binding_without_preload_content("nope", "default", binding)
    assert missing.status == 404
    mismatched = await core.create_namespaced_pod_binding_without_preload_content("p1", "default", binding)
    assert mismatched.status == 400
    stored = fake_api.get("pods", "p1", "default")
    assert stored is not None and stored["spec"]["nodeName"] == "n1"
    scheduled = [c for c in stored["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert scheduled[0]["status"] == "True"


async def test_lease_renewal_race(fake_api_aio_client: Any) -> None:
    coord = client.CoordinationV1Api(fake_api_aio_client)
    held = await coord.create_namespaced_lease("kube-system", lease("allocator", "a", "kube-system"))
    copy_b = await coord.read_namespaced_lease("allocator", "kube-system")
    held.spec.lease_transitions = 0
    renewed = await coord.replace_namespaced_lease("allocator", "kube-system", held)
    copy_b.spec.holder_identity = "b"
    with pytest.raises(ApiException) as err:
        await coord.replace_namespaced_lease("allocator", "kube-system", copy_b)
    assert err.value.status == 409
    current = await coord.read_namespaced_lease("allocator", "kube-system")
    assert current.spec.holder_identity == "a"
    assert current.metadata.resource_version == renewed.metadata.resource_version


async def test_aio_watch_resume_bookmarks_and_timeout(
    fake_api: FakeApiServer, fake_api_aio_client: Any
) -> None:
    core = client.CoreV1Api(fake_api_aio_client)
    await core.create_namespaced_pod("default", pod("p1"))
    start = (await core.list_namespaced_pod("default")).metadata.resource_version
    await core.create_namespaced_pod("default", pod("p2"))
    seen: list[tuple[str, str]] = []
    w = watch.Watch()
    loop = asyncio.get_running_loop()
    began = loop.time()
    async with w.stream(
        core.list_namespaced_pod,
        "default",
        resource_version=start,
        allow_watch_bookmarks=True,
        timeout_seconds=1,
    ) as stream:
        async for event in stream:
            seen.append((event["type"], event["raw_object"]["metadata"].get("name", "")))
    elapsed = loop.time() - began
    assert seen[0] == ("ADDED", "p2")
    assert {t for t, _ in seen[1:]} == {"BOOKMARK"}  # the store moved past `start`: bookmarks are due
    assert len(seen) >= 2
    assert 0.9 <= elapsed < 3  # timeoutSeconds ends the stream
    assert w.resource_version == fake_api.resource_version


async def test_raw_list_and_watch_for_a_reflector(fake_api: FakeApiServer, fake_api_aio_client: Any) -> None:
    """What the allocator's reflector does: raw LIST, then raw WATCH from its resourceVersion."""
    core = client.CoreV1Api(fake_api_aio_client)
    fake_api.put(pod("seeded"))
    listing = await core.list_pod_for_all_namespaces_without_preload_content()
    body = await listing.json()
    assert [i["metadata"]["name"] for i in body["items"]] == ["seeded"]
    assert "kind" not in body["items"][0]  # built-in list items carry no kind
    response = await core.list_pod_for_all_namespaces_without_preload_content(
        watch=True, resource_version=body["metadata"]["resourceVersion"], timeout_seconds=5
    )
    await fake_api.wait_for_watches(1, "pods")
    await core.create_namespaced_pod("default", pod("new"))
    line = await asyncio.wait_for(response.content.readline(), 5)
    event = json.loads(line)
    assert (event["type"], event["object"]["kind"], event["object"]["metadata"]["name"]) == (
        "ADDED",
        "Pod",
        "new",
    )
    response.release()


async def test_builtin_status_subresource(fake_api: FakeApiServer, fake_api_aio_client: Any) -> None:
    core = client.CoreV1Api(fake_api_aio_client)
    fake_api.put({**node("n1"), "status": {"capacity": {"nvidia.com/gpu": "8"}}})
    current = await core.read_node("n1")
    current.metadata.labels = {"set-through": "status"}
    current.status.capacity = {"nvidia.com/gpu": "4"}
    after_status = await core.replace_node_status("n1", current)
    assert after_status.status.capacity == {"nvidia.com/gpu": "4"}
    assert after_status.metadata.labels is None  # a status write changes only status

    after_status.metadata.labels = {"set-through": "main"}
    after_status.status.capacity = {"nvidia.com/gpu": "0"}
    after_main = await core.replace_node("n1", after_status)
    assert after_main.metadata.labels == {"set-through": "main"}
    assert after_main.status.capacity == {"nvidia.com/gpu": "4"}  # a main write keeps the stored status

    fake_api.put(pod("p"))
    running = await core.patch_namespaced_pod_status("p", "default", {"status": {"phase": "Running"}})
    assert running.status.phase == "Running"
    assert running.status.qos_class == "BestEffort"  # strategic merge kept the rest of the status
