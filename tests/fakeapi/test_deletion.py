"""DELETE: finalizers, pod grace periods, preconditions, namespaces and collections."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from tests.support.fakeapi import FakeApiServer

from .manifests import DEVICES, device, node, pod, podgroup
from .streams import events, summary


async def _pod_watch(api: Any, rv: str, namespace: str = "default") -> Any:
    return await client.CoreV1Api(api).list_namespaced_pod_without_preload_content(
        namespace, watch=True, resource_version=rv, timeout_seconds=10
    )


async def test_finalizers_hold_an_object_until_removed(
    fake_api: FakeApiServer, fake_api_aio_client: Any
) -> None:
    custom = client.CustomObjectsApi(fake_api_aio_client)
    body = device("node-1")
    body["metadata"]["finalizers"] = ["example.com/cleanup"]
    await custom.create_cluster_custom_object(*DEVICES, body)
    start = fake_api.resource_version
    watch = await custom.list_cluster_custom_object_without_preload_content(
        *DEVICES, watch=True, resource_version=start, timeout_seconds=10
    )

    marked = await custom.delete_cluster_custom_object(*DEVICES, "node-1")
    assert marked["metadata"]["deletionTimestamp"] and marked["metadata"]["deletionGracePeriodSeconds"] == 0
    again = await custom.delete_cluster_custom_object(*DEVICES, "node-1")
    assert again["metadata"]["resourceVersion"] == marked["metadata"]["resourceVersion"]  # nothing new
    with pytest.raises(ApiException) as err:
        await custom.patch_cluster_custom_object(
            *DEVICES, "node-1", {"metadata": {"finalizers": ["example.com/cleanup", "example.com/more"]}}
        )
    assert err.value.status == 422
    assert (
        "no new finalizers can be added if the object is being deleted"
        in json.loads(err.value.body)["message"]
    )

    assert marked["metadata"]["generation"] == 2  # marking a generation-tracked object bumps it

    # Clearing the last finalizer deletes instead of writing: the answer is the object as sent, and
    # watchers get one DELETED carrying the last stored state (finalizer and all), as the apiserver does.
    answer = await custom.patch_cluster_custom_object(*DEVICES, "node-1", {"metadata": {"finalizers": None}})
    assert "finalizers" not in answer["metadata"]
    with pytest.raises(ApiException) as err:
        await custom.get_cluster_custom_object(*DEVICES, "node-1")
    assert err.value.status == 404
    got = await events(watch, 2)
    assert summary(got) == [("MODIFIED", "node-1"), ("DELETED", "node-1")]
    assert got[1]["object"]["metadata"]["finalizers"] == ["example.com/cleanup"]
    watch.release()


async def test_deleting_a_node_answers_a_success_status(
    fake_api: FakeApiServer, fake_api_aio_client: Any
) -> None:
    fake_api.put(node("n1"))
    uid = fake_api.get("nodes", "n1")["metadata"]["uid"]  # type: ignore[index]
    response = await client.CoreV1Api(fake_api_aio_client).delete_node_without_preload_content("n1")
    assert response.status == 200
    assert json.loads(await response.read()) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": "n1", "kind": "nodes", "uid": uid},
    }
    assert fake_api.get("nodes", "n1") is None


async def test_pod_grace_periods(fake_api: FakeApiServer, fake_api_aio_client: Any) -> None:
    """As recorded: a bound pod lingers with its deletionTimestamp (no kubelet); grace 0 or an unbound
    pod gives MODIFIED then DELETED."""
    core = client.CoreV1Api(fake_api_aio_client)
    fake_api.put(pod("bound", node="n1"))
    fake_api.put(pod("unbound"))
    watch = await _pod_watch(fake_api_aio_client, fake_api.resource_version)

    graceful = await core.delete_namespaced_pod("bound", "default", grace_period_seconds=30)
    assert graceful.metadata.deletion_grace_period_seconds == 30
    assert fake_api.get("pods", "bound", "default") is not None
    longer = await core.delete_namespaced_pod("bound", "default", grace_period_seconds=60)
    assert longer.metadata.resource_version == graceful.metadata.resource_version  # only shorter counts
    forced = await core.delete_namespaced_pod("bound", "default", grace_period_seconds=0)
    assert forced.metadata.deletion_grace_period_seconds == 0
    unbound = await core.delete_namespaced_pod("unbound", "default")
    assert unbound.metadata.deletion_grace_period_seconds == 0
    assert fake_api.list_objects("pods", "default") == []

    got = await events(watch, 5)
    assert summary(got) == [
        ("MODIFIED", "bound"),
        ("MODIFIED", "bound"),
        ("DELETED", "bound"),
        ("MODIFIED", "unbound"),
        ("DELETED", "unbound"),
    ]
    assert forced.metadata.resource_version == got[2]["object"]["metadata"]["resourceVersion"]
    watch.release()


async def test_pod_with_finalizer_waits_after_force_delete(
    fake_api: FakeApiServer, fake_api_aio_client: Any
) -> None:
    core = client.CoreV1Api(fake_api_aio_client)
    body = pod("p", node="n1")
    body["metadata"]["finalizers"] = ["example.com/hold"]
    fake_api.put(body)
    await core.delete_namespaced_pod("p", "default", grace_period_seconds=0)
    stored = fake_api.get("pods", "p", "default")
    assert stored is not None and stored["metadata"]["deletionGracePeriodSeconds"] == 0
    await core.patch_namespaced_pod(
        "p", "default", {"metadata": {"$deleteFromPrimitiveList/finalizers": ["example.com/hold"]}}
    )
    assert fake_api.get("pods", "p", "default") is None


async def test_delete_preconditions(fake_api: FakeApiServer, fake_api_aio_client: Any) -> None:
    fake_api.put(node("n1"))
    with pytest.raises(ApiException) as err:
        await client.CoreV1Api(fake_api_aio_client).delete_node(
            "n1", body={"preconditions": {"uid": "00000000-0000-0000-0000-000000000000"}}
        )
    assert err.value.status == 409
    assert fake_api.get("nodes", "n1") is not None


async def test_deleting_a_namespace_deletes_its_contents(
    fake_api: FakeApiServer, fake_api_aio_client: Any
) -> None:
    core = client.CoreV1Api(fake_api_aio_client)
    fake_api.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}})
    fake_api.put(pod("a", "team", node="n1"))
    fake_api.put(podgroup("gang", "team"))
    held = pod("held", "team")
    held["metadata"]["finalizers"] = ["example.com/hold"]
    fake_api.put(held)

    response = await core.delete_namespace_without_preload_content("team")
    terminating = json.loads(await response.read())
    assert (response.status, terminating["kind"], terminating["status"]["phase"]) == (
        200,
        "Namespace",
        "Terminating",
    )
    assert [p["metadata"]["name"] for p in fake_api.list_objects("pods", "team")] == ["held"]
    assert fake_api.list_objects("podgroups", "team") == []
    with pytest.raises(ApiException) as err:
        await core.create_namespaced_pod("team", pod("late", "team"))
    assert err.value.status == 403
    assert "because it is being terminated" in json.loads(err.value.body)["message"]

    await core.patch_namespaced_pod(
        "held", "team", {"metadata": {"finalizers": None}}, _content_type="application/merge-patch+json"
    )
    assert fake_api.get("namespaces", "team") is None


async def test_delete_collection_with_a_selector(fake_api: FakeApiServer, fake_api_aio_client: Any) -> None:
    fake_api.put(node("gpu-1", gpu="true"))
    fake_api.put(node("gpu-2", gpu="true"))
    fake_api.put(node("cpu-1"))
    deleted = await client.CoreV1Api(fake_api_aio_client).delete_collection_node(label_selector="gpu=true")
    assert deleted is not None
    assert [n["metadata"]["name"] for n in fake_api.list_objects("nodes")] == ["cpu-1"]
