"""Patch semantics: the strategic-merge algorithm on its own, then every patch type over HTTP."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from tests.support.fakeapi import FakeApiServer
from tests.support.fakeapi.builtin import POD_SCHEMA
from tests.support.fakeapi.patching import merge_patch
from tests.support.fakeapi.strategic import StrategicPatchError, apply

from .manifests import DEVICES, device, pod


def _names(items: list[dict[str, Any]], key: str = "name") -> list[str]:
    return [i[key] for i in items]


def test_merge_patch_rfc7386() -> None:
    target = {"a": "b", "c": {"d": "e", "f": "g"}, "list": [1, 2]}
    patch = {"a": "z", "c": {"f": None}, "list": [3], "new": {"x": None, "y": 1}}
    assert merge_patch(target, patch) == {"a": "z", "c": {"d": "e"}, "list": [3], "new": {"y": 1}}


def test_strategic_merges_lists_by_key_and_puts_new_items_first() -> None:
    """The recorded 422 names the added gate at index 0: a new item goes before server-only items."""
    original = {"spec": {"schedulingGates": [{"name": "wait"}]}}
    merged = apply(original, {"spec": {"schedulingGates": [{"name": "another"}]}}, POD_SCHEMA)
    assert _names(merged["spec"]["schedulingGates"]) == ["another", "wait"]


def test_strategic_keeps_server_order_where_both_sides_know_an_item() -> None:
    original = {
        "spec": {"containers": [{"name": "b", "image": "b:1"}, {"name": "c"}, {"name": "a", "image": "a:1"}]}
    }
    patch = {
        "spec": {"containers": [{"name": "a", "image": "a:2"}, {"name": "b", "image": "b:2"}, {"name": "d"}]}
    }
    merged = apply(original, patch, POD_SCHEMA)["spec"]["containers"]
    # The design document's example: C (server-only) first, then A', B', D.
    assert _names(merged) == ["c", "a", "b", "d"]
    assert [c.get("image") for c in merged] == [None, "a:2", "b:2", None]


def test_strategic_nested_merge_keys_and_maps() -> None:
    original = {
        "metadata": {"labels": {"a": "1", "b": "2"}},
        "spec": {
            "containers": [{"name": "c", "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}]}]
        },
    }
    patch = {
        "metadata": {"labels": {"b": None, "c": "3"}},
        "spec": {"containers": [{"name": "c", "env": [{"name": "Y", "value": "two"}]}]},
    }
    merged = apply(original, patch, POD_SCHEMA)
    assert merged["metadata"]["labels"] == {"a": "1", "c": "3"}
    assert merged["spec"]["containers"][0]["env"] == [
        {"name": "X", "value": "1"},
        {"name": "Y", "value": "two"},
    ]


def test_strategic_replaces_lists_without_a_merge_key() -> None:
    original = {"spec": {"tolerations": [{"key": "a"}, {"key": "b"}]}}
    merged = apply(original, {"spec": {"tolerations": [{"key": "c"}]}}, POD_SCHEMA)
    assert merged["spec"]["tolerations"] == [{"key": "c"}]


def test_strategic_directives() -> None:
    original = {
        "metadata": {"finalizers": ["a", "b"]},
        "spec": {"containers": [{"name": "x", "image": "1"}, {"name": "y", "image": "2"}]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    deleted = apply(original, {"spec": {"containers": [{"name": "x", "$patch": "delete"}]}}, POD_SCHEMA)
    assert _names(deleted["spec"]["containers"]) == ["y"]
    replaced = apply(original, {"spec": {"containers": [{"name": "z"}, {"$patch": "replace"}]}}, POD_SCHEMA)
    assert replaced["spec"]["containers"] == [{"name": "z"}]
    map_replaced = apply(original, {"status": {"$patch": "replace", "phase": "Running"}}, POD_SCHEMA)
    assert map_replaced["status"] == {"phase": "Running"}
    # Finalizers merge as a set; removal takes the $deleteFromPrimitiveList directive.
    added = apply(original, {"metadata": {"finalizers": ["c", "a"]}}, POD_SCHEMA)
    assert sorted(added["metadata"]["finalizers"]) == ["a", "b", "c"]
    removed = apply(original, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}, POD_SCHEMA)
    assert removed["metadata"]["finalizers"] == ["b"]
    reordered = apply(
        original,
        {"spec": {"$setElementOrder/containers": [{"name": "y"}, {"name": "x"}]}},
        POD_SCHEMA,
    )
    assert _names(reordered["spec"]["containers"]) == ["y", "x"]
    retained = apply({"a": 1, "b": 2}, {"$retainKeys": ["b", "c"], "c": 3}, {})
    assert retained == {"b": 2, "c": 3}


def test_strategic_rejects_items_without_their_merge_key() -> None:
    with pytest.raises(StrategicPatchError, match="merge key: name"):
        apply({"spec": {"containers": []}}, {"spec": {"containers": [{"image": "x"}]}}, POD_SCHEMA)


async def test_patch_types_over_http(fake_api: FakeApiServer, fake_api_aio_client: Any) -> None:
    core = client.CoreV1Api(fake_api_aio_client)
    await core.create_namespaced_pod("default", pod("p", labels={"a": "1"}))
    merged = await core.patch_namespaced_pod(
        "p",
        "default",
        {"metadata": {"labels": {"a": None, "b": "2"}}},
        _content_type="application/merge-patch+json",
    )
    assert merged.metadata.labels == {"b": "2"}
    patched = await core.patch_namespaced_pod(
        "p",
        "default",
        [
            {"op": "test", "path": "/metadata/labels/b", "value": "2"},
            {"op": "add", "path": "/metadata/annotations", "value": {"k": "v"}},
        ],
    )
    assert patched.metadata.annotations == {"k": "v"}
    strategic = await core.patch_namespaced_pod(
        "p", "default", {"spec": {"containers": [{"name": "main", "image": "registry.invalid/cuda:13"}]}}
    )
    assert [c.image for c in strategic.spec.containers] == ["registry.invalid/cuda:13"]
    assert [(r.content_type, r.status) for r in fake_api.requests("PATCH")] == [
        ("application/merge-patch+json", 200),
        ("application/json-patch+json", 200),
        ("application/strategic-merge-patch+json", 200),
    ]


async def test_failed_json_patch_test_is_422_and_changes_nothing(
    fake_api: FakeApiServer, fake_api_aio_client: Any
) -> None:
    core = client.CoreV1Api(fake_api_aio_client)
    created = await core.create_namespaced_pod("default", pod("p", labels={"a": "1"}))
    with pytest.raises(ApiException) as err:
        await core.patch_namespaced_pod(
            "p",
            "default",
            [
                {"op": "test", "path": "/metadata/labels/a", "value": "2"},
                {"op": "remove", "path": "/metadata/labels"},
            ],
        )
    assert err.value.status == 422
    stored = fake_api.get("pods", "p", "default")
    assert stored is not None and stored["metadata"]["resourceVersion"] == created.metadata.resource_version


async def test_patch_with_a_stale_resource_version_is_a_conflict(fake_api_aio_client: Any) -> None:
    core = client.CoreV1Api(fake_api_aio_client)
    created = await core.create_namespaced_pod("default", pod("p"))
    await core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"x": "1"}}})
    stale = {"metadata": {"resourceVersion": created.metadata.resource_version, "labels": {"x": "2"}}}
    with pytest.raises(ApiException) as err:
        await core.patch_namespaced_pod("p", "default", stale, _content_type="application/merge-patch+json")
    assert err.value.status == 409


async def test_noop_patch_keeps_the_resource_version_and_emits_nothing(
    fake_api: FakeApiServer, fake_api_aio_client: Any
) -> None:
    custom = client.CustomObjectsApi(fake_api_aio_client)
    created = await custom.create_cluster_custom_object(*DEVICES, device("node-1"))
    before = fake_api.resource_version
    again = await custom.patch_cluster_custom_object(*DEVICES, "node-1", {"spec": created["spec"]})
    assert again["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    assert fake_api.resource_version == before


async def test_unknown_patch_type_is_415(fake_api: FakeApiServer) -> None:
    fake_api.put(pod("p"))
    async with fake_api.aio_api_client() as api:
        response = await client.CoreV1Api(api).patch_namespaced_pod_without_preload_content(
            "p", "default", {"metadata": {}}, _content_type="application/apply-patch+yaml"
        )
        body = json.loads(await response.read())
    assert response.status == 415
    assert body["reason"] == "UnsupportedMediaType"
    assert body["message"].startswith(
        "the body of the request was in an unknown format - accepted media types"
    )
