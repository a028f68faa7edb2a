"""The official sync `kubernetes` client against the fake, over real HTTP (server on a background thread)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from kubernetes import client, dynamic, watch
from kubernetes.client.exceptions import ApiException
from kubernetes.informer import SharedInformer

from tests.support.fakeapi import FakeApiServer

from .manifests import DEVICES, device, lease, node, pod


def _core(api: Any) -> client.CoreV1Api:
    return client.CoreV1Api(api)


def test_pod_crud(fake_api_sync_client: Any) -> None:
    core = _core(fake_api_sync_client)
    created = core.create_namespaced_pod("default", pod("p1", labels={"app": "a"}))
    assert created.metadata.uid and created.metadata.resource_version
    assert created.status.phase == "Pending"

    got = core.read_namespaced_pod("p1", "default")
    assert got.metadata.uid == created.metadata.uid

    listed = core.list_namespaced_pod("default")
    assert [p.metadata.name for p in listed.items] == ["p1"]
    assert int(listed.metadata.resource_version) >= int(created.metadata.resource_version)

    got.metadata.labels["tier"] = "gpu"
    replaced = core.replace_namespaced_pod("p1", "default", got)
    assert replaced.metadata.labels == {"app": "a", "tier": "gpu"}
    assert int(replaced.metadata.resource_version) > int(got.metadata.resource_version)

    deleted = core.delete_namespaced_pod("p1", "default")
    assert deleted.metadata.deletion_timestamp is not None or deleted.metadata.name == "p1"
    with pytest.raises(ApiException) as err:
        core.read_namespaced_pod("p1", "default")
    assert err.value.status == 404
    assert json.loads(err.value.body)["message"] == 'pods "p1" not found'


def test_create_twice_is_409_already_exists(fake_api_sync_client: Any) -> None:
    core = _core(fake_api_sync_client)
    core.create_namespaced_pod("default", pod("p1"))
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod("default", pod("p1"))
    body = json.loads(err.value.body)
    assert err.value.status == 409
    assert (body["reason"], body["message"]) == ("AlreadyExists", 'pods "p1" already exists')


def test_put_with_stale_resource_version_is_409_conflict(fake_api_sync_client: Any) -> None:
    core = _core(fake_api_sync_client)
    core.create_node(node("n1"))
    first = core.read_node("n1")
    second = core.read_node("n1")
    first.metadata.labels = {"writer": "first"}
    core.replace_node("n1", first)
    second.metadata.labels = {"writer": "second"}
    with pytest.raises(ApiException) as err:
        core.replace_node("n1", second)
    body = json.loads(err.value.body)
    assert err.value.status == 409
    assert body["reason"] == "Conflict"
    assert body["message"] == (
        'Operation cannot be fulfilled on nodes "n1": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )
    assert core.read_node("n1").metadata.labels == {"writer": "first"}


def test_lease_create_and_renew_with_precondition(fake_api_sync_client: Any) -> None:
    coord = client.CoordinationV1Api(fake_api_sync_client)
    created = coord.create_namespaced_lease("default", lease("leader", "a"))
    created.spec.renew_time = "2026-01-01T00:00:01.000000Z"
    renewed = coord.replace_namespaced_lease("leader", "default", created)
    assert renewed.metadata.resource_version != created.metadata.resource_version
    assert renewed.spec.holder_identity == "a"
    # A candidate still holding the pre-renewal copy loses the race, which is what makes leases safe.
    created.spec.holder_identity = "b"
    with pytest.raises(ApiException) as err:
        coord.replace_namespaced_lease("leader", "default", created)
    assert err.value.status == 409
    assert json.loads(err.value.body)["details"] == {
        "name": "leader",
        "group": "coordination.k8s.io",
        "kind": "leases",
    }


def test_patch_types_chosen_by_the_client(fake_api_thread: FakeApiServer, fake_api_sync_client: Any) -> None:
    core = _core(fake_api_sync_client)
    core.create_namespaced_pod("default", pod("p1", labels={"a": "1"}))
    strategic = core.patch_namespaced_pod("p1", "default", {"metadata": {"labels": {"b": "2"}}})
    assert strategic.metadata.labels == {"a": "1", "b": "2"}
    json_patched = core.patch_namespaced_pod(
        "p1", "default", [{"op": "remove", "path": "/metadata/labels/a"}]
    )
    assert json_patched.metadata.labels == {"b": "2"}
    types = [r.content_type for r in fake_api_thread.requests("PATCH")]
    assert types == ["application/strategic-merge-patch+json", "application/json-patch+json"]


def test_binding_needs_the_raw_call_and_answers_201_then_409(fake_api_sync_client: Any) -> None:
    """The client cannot parse the Status a binding returns (it expects a V1Binding): use
    _preload_content=False and read the status code."""
    core = _core(fake_api_sync_client)
    core.create_namespaced_pod("default", pod("p1"))
    binding = client.V1Binding(
        metadata=client.V1ObjectMeta(name="p1"), target=client.V1ObjectReference(kind="Node", name="node-1")
    )
    response = core.create_namespaced_pod_binding("p1", "default", binding, _preload_content=False)
    assert response.status == 201
    assert json.loads(response.data) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "code": 201,
    }
    assert core.read_namespaced_pod("p1", "default").spec.node_name == "node-1"
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod_binding("p1", "default", binding, _preload_content=False)
    assert err.value.status == 409
    assert json.loads(err.value.body)["message"] == (
        'Operation cannot be fulfilled on pods/binding "p1": pod p1 is already assigned to node "node-1"'
    )


def test_watch_resumes_from_a_resource_version(fake_api_sync_client: Any) -> None:
    core = _core(fake_api_sync_client)
    core.create_namespaced_pod("default", pod("before"))
    start = core.list_namespaced_pod("default").metadata.resource_version
    core.create_namespaced_pod("default", pod("after"))
    core.patch_namespaced_pod("before", "default", {"metadata": {"labels": {"x": "y"}}})
    events = []
    stream = watch.Watch().stream(
        core.list_namespaced_pod, "default", resource_version=start, timeout_seconds=5
    )
    for event in stream:
        events.append((event["type"], event["object"].metadata.name))
        if len(events) == 2:
            stream.close()
    assert events == [("ADDED", "after"), ("MODIFIED", "before")]


def test_watch_after_compaction_raises_410(fake_api_thread: FakeApiServer, fake_api_sync_client: Any) -> None:
    core = _core(fake_api_sync_client)
    core.create_namespaced_pod("default", pod("p1"))
    old = core.list_namespaced_pod("default").metadata.resource_version
    core.create_namespaced_pod("default", pod("p2"))
    fake_api_thread.compact()
    with pytest.raises(ApiException) as err:
        list(
            watch.Watch().stream(core.list_namespaced_pod, "default", resource_version=old, timeout_seconds=1)
        )
    assert err.value.status == 410
    assert "too old resource version" in err.value.reason
    with pytest.raises(ApiException) as err:
        core.list_namespaced_pod("default", resource_version=old, resource_version_match="Exact")
    assert err.value.status == 410
    assert json.loads(err.value.body)["message"] == "The resourceVersion for the provided list is too old."


def test_custom_objects_and_status_subresource(fake_api_sync_client: Any) -> None:
    custom = client.CustomObjectsApi(fake_api_sync_client)
    created = custom.create_cluster_custom_object(*DEVICES, {**device("node-1"), "status": {"ignored": True}})
    assert "status" not in created  # status is only written through /status
    assert created["metadata"]["generation"] == 1
    # A field the CRD's schema lacks is pruned silently, as kube-apiserver prunes it.
    with_status = custom.patch_cluster_custom_object_status(
        *DEVICES, "node-1", {"status": {"summary": {"gpus": 2}, "conditions": []}}
    )
    assert with_status["status"] == {"summary": {"gpus": 2}}
    assert with_status["metadata"]["generation"] == 1
    respec = custom.patch_cluster_custom_object(*DEVICES, "node-1", {"spec": {"devices": []}, "status": None})
    assert respec["status"] == {"summary": {"gpus": 2}}  # main-resource writes keep the stored status
    assert respec["metadata"]["generation"] == 2


def test_informer_relists_after_410(fake_api_thread: FakeApiServer, fake_api_sync_client: Any) -> None:
    """The official SharedInformer recovers through the fake's 410: compaction plus a broken watch
    makes it relist, and a deletion made in the gap shows up as DELETED."""
    core = _core(fake_api_sync_client)
    core.create_namespaced_pod("default", pod("a"))
    core.create_namespaced_pod("default", pod("b"))
    deleted: list[str] = []
    relisted = threading.Event()
    informer = SharedInformer(core.list_namespaced_pod, namespace="default", resync_period=1)
    informer.add_event_handler("DELETED", lambda obj: (deleted.append(obj.metadata.name), relisted.set()))
    informer.start()
    try:
        fake_api_thread.wait_for_watches_blocking(1, "pods")
        lists_before = len(fake_api_thread.requests("GET", "/api/v1/namespaces/default/pods", watch=False))
        # Hold the informer's next watch back long enough to change things behind its back.
        fake_api_thread.inject_fault("GET", r"/pods$", watch=True, delay=0.5)
        fake_api_thread.break_watches()
        fake_api_thread.remove("pods", "b", "default")
        fake_api_thread.compact()
        assert relisted.wait(10)
        assert deleted == ["b"]
        # The informer fires DELETED before it swaps its cache: wait for the swap.
        deadline = time.monotonic() + 5
        while sorted(informer.cache.list_keys()) != ["default/a"] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sorted(informer.cache.list_keys()) == ["default/a"]
        lists_after = len(fake_api_thread.requests("GET", "/api/v1/namespaces/default/pods", watch=False))
        assert lists_after == lists_before + 1
    finally:
        informer.stop()


def test_dynamic_client_discovers_and_serves_crds(fake_api_sync_client: Any) -> None:
    dyn = dynamic.DynamicClient(fake_api_sync_client)
    devices = dyn.resources.get(api_version="scheduling.koordinator.sh/v1alpha1", kind="Device")
    assert devices.namespaced is False
    devices.create(body=device("node-7"))
    assert [d.metadata.name for d in devices.get().items] == ["node-7"]
    pods = dyn.resources.get(api_version="v1", kind="Pod")
    assert pods.namespaced is True and "binding" in pods.subresources
