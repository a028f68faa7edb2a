"""LIST: resourceVersion semantics, pagination and selectors, through the official clients."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client as sync_client
from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException
from kubernetes.client.exceptions import ApiException as SyncApiException

from tests.support.fakeapi import FakeApiServer

from .manifests import node, pod


async def _names(api: Any, namespace: str | None = "default", **params: Any) -> list[str]:
    core = client.CoreV1Api(api)
    if namespace is None:
        listed = await core.list_pod_for_all_namespaces(**params)
    else:
        listed = await core.list_namespaced_pod(namespace, **params)
    return [p.metadata.name for p in listed.items]


async def test_list_reports_the_current_resource_version(
    fake_api: FakeApiServer, fake_api_aio_client: Any
) -> None:
    fake_api.put(pod("a"))
    fake_api.put(node("n1"))  # another resource moves the global resourceVersion too
    listed = await client.CoreV1Api(fake_api_aio_client).list_namespaced_pod("default")
    assert listed.metadata.resource_version == fake_api.resource_version


async def test_exact_list_serves_history_and_410s_once_compacted(
    fake_api: FakeApiServer, fake_api_aio_client: Any
) -> None:
    fake_api.put(pod("a", labels={"v": "1"}))
    then = fake_api.resource_version
    fake_api.put(pod("a", labels={"v": "2"}))
    fake_api.put(pod("b"))
    core = client.CoreV1Api(fake_api_aio_client)
    past = await core.list_namespaced_pod("default", resource_version=then, resource_version_match="Exact")
    assert [(p.metadata.name, p.metadata.labels) for p in past.items] == [("a", {"v": "1"})]
    assert past.metadata.resource_version == then
    # NotOlderThan (and no match at all) is served from the current state, as the watch cache does.
    current = await core.list_namespaced_pod(
        "default", resource_version=then, resource_version_match="NotOlderThan"
    )
    assert [p.metadata.name for p in current.items] == ["a", "b"]

    fake_api.compact()
    with pytest.raises(ApiException) as err:
        await core.list_namespaced_pod("default", resource_version=then, resource_version_match="Exact")
    assert err.value.status == 410
    assert json.loads(err.value.body) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "The resourceVersion for the provided list is too old.",
        "reason": "Expired",
        "code": 410,
    }
    assert await _names(fake_api_aio_client, resource_version=then) == ["a", "b"]


async def test_list_at_a_future_resource_version_is_504(
    fake_api: FakeApiServer, fake_api_aio_client: Any
) -> None:
    future = str(int(fake_api.resource_version) + 10)
    with pytest.raises(ApiException) as err:
        await client.CoreV1Api(fake_api_aio_client).list_namespaced_pod("default", resource_version=future)
    assert err.value.status == 504
    assert err.value.headers["Retry-After"] == "1"


async def test_pagination_with_limit_and_continue(fake_api: FakeApiServer, fake_api_aio_client: Any) -> None:
    for name in ("p1", "p2", "p3"):
        fake_api.put(pod(name))
    fake_api.put(pod("q", "kube-system"))
    core = client.CoreV1Api(fake_api_aio_client)
    first = await core.list_pod_for_all_namespaces(limit=2)
    assert [(p.metadata.namespace, p.metadata.name) for p in first.items] == [
        ("default", "p1"),
        ("default", "p2"),
    ]
    assert first.metadata.remaining_item_count == 2
    fake_api.put(pod("p0"))  # a later write does not disturb the paged snapshot
    second = await core.list_pod_for_all_namespaces(limit=2, _continue=first.metadata._continue)
    assert [(p.metadata.namespace, p.metadata.name) for p in second.items] == [
        ("default", "p3"),
        ("kube-system", "q"),
    ]
    assert second.metadata._continue is None
    assert second.metadata.resource_version == first.metadata.resource_version

    third = await core.list_pod_for_all_namespaces(limit=1)
    fake_api.put(pod("p9"))
    fake_api.compact()  # the snapshot the token points at is gone
    with pytest.raises(ApiException) as err:
        await core.list_pod_for_all_namespaces(limit=1, _continue=third.metadata._continue)
    assert err.value.status == 410


async def test_label_selectors(fake_api: FakeApiServer, fake_api_aio_client: Any) -> None:
    fake_api.put(pod("gpu-a", labels={"tier": "gpu", "pg": "a"}))
    fake_api.put(pod("gpu-b", labels={"tier": "gpu", "pg": "b"}))
    fake_api.put(pod("cpu", labels={"tier": "cpu"}))
    fake_api.put(pod("bare"))
    api = fake_api_aio_client
    assert await _names(api, label_selector="tier=gpu") == ["gpu-a", "gpu-b"]
    assert await _names(api, label_selector="tier==gpu,pg=b") == ["gpu-b"]
    assert await _names(api, label_selector="tier!=gpu") == ["bare", "cpu"]
    assert await _names(api, label_selector="tier in (cpu, gpu),pg notin (a)") == ["cpu", "gpu-b"]
    assert await _names(api, label_selector="pg") == ["gpu-a", "gpu-b"]
    assert await _names(api, label_selector="!pg") == ["bare", "cpu"]
    with pytest.raises(ApiException) as err:
        await _names(api, label_selector="tier in (gpu")
    assert err.value.status == 400


async def test_field_selectors(fake_api: FakeApiServer, fake_api_aio_client: Any) -> None:
    fake_api.put(pod("pending"))
    fake_api.put(pod("bound", node="n1"))
    fake_api.put({**pod("done", node="n1"), "status": {"phase": "Succeeded"}})
    fake_api.put(pod("system", "kube-system"))
    api = fake_api_aio_client
    unassigned = "spec.nodeName=,status.phase!=Succeeded,status.phase!=Failed"
    assert await _names(api, None, field_selector=unassigned) == ["pending", "system"]
    assert await _names(api, None, field_selector="spec.nodeName=n1") == ["bound", "done"]
    assert await _names(api, None, field_selector="metadata.namespace=kube-system") == ["system"]
    assert await _names(api, None, field_selector="metadata.name==bound") == ["bound"]
    with pytest.raises(ApiException) as err:
        await _names(api, None, field_selector="spec.priority=1")
    assert err.value.status == 400
    assert json.loads(err.value.body)["message"] == "field label not supported: spec.priority"


def test_sync_client_lists_nodes_with_selectors(
    fake_api_thread: FakeApiServer, fake_api_sync_client: Any
) -> None:
    fake_api_thread.put(node("gpu-1", gpu="true"))
    fake_api_thread.put(node("cpu-1"))
    core = sync_client.CoreV1Api(fake_api_sync_client)
    assert [n.metadata.name for n in core.list_node(label_selector="gpu=true").items] == ["gpu-1"]
    assert [n.metadata.name for n in core.list_node(field_selector="metadata.name=cpu-1").items] == ["cpu-1"]
    with pytest.raises(SyncApiException) as err:
        core.list_node(field_selector="metadata.namespace=default")  # nodes have no namespace field
    assert err.value.status == 400
