"""Discovery documents through the official clients' discovery calls."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException


def test_version(fake_api_sync_client: Any) -> None:
    info = client.VersionApi(fake_api_sync_client).get_code()
    assert (info.major, info.minor, info.git_version) == ("1", "32", "v1.32.13")


def test_core_group(fake_api_thread: Any, fake_api_sync_client: Any) -> None:
    versions = client.CoreApi(fake_api_sync_client).get_api_versions()
    assert versions.versions == ["v1"]
    assert versions.server_address_by_client_cidrs[0].server_address == f"127.0.0.1:{fake_api_thread.port}"
    resources = {r.name: r for r in client.CoreV1Api(fake_api_sync_client).get_api_resources().resources}
    assert {"pods", "pods/status", "pods/binding", "nodes", "nodes/status", "namespaces", "events"} <= set(
        resources
    )
    assert (resources["pods"].kind, resources["pods"].namespaced, resources["pods"].short_names) == (
        "Pod",
        True,
        ["po"],
    )
    assert resources["pods/binding"].kind == "Binding" and resources["pods/binding"].verbs == ["create"]
    assert resources["nodes"].namespaced is False
    assert "watch" in resources["pods"].verbs and "patch" in resources["pods/status"].verbs


def test_named_groups(fake_api_sync_client: Any) -> None:
    groups = {g.name: g for g in client.ApisApi(fake_api_sync_client).get_api_versions().groups}
    assert {
        "coordination.k8s.io",
        "events.k8s.io",
        "scheduling.koordinator.sh",
        "scheduling.x-k8s.io",
    } <= set(groups)
    assert (
        groups["scheduling.koordinator.sh"].preferred_version.group_version
        == "scheduling.koordinator.sh/v1alpha1"
    )
    leases = client.CoordinationV1Api(fake_api_sync_client).get_api_resources()
    assert [(r.name, r.kind, r.namespaced) for r in leases.resources] == [("leases", "Lease", True)]
    group = client.CoordinationApi(fake_api_sync_client).get_api_group()
    assert group.name == "coordination.k8s.io" and group.versions[0].version == "v1"
    podgroups = client.CustomObjectsApi(fake_api_sync_client).get_api_resources(
        "scheduling.x-k8s.io", "v1alpha1"
    )
    assert [(r.name, r.namespaced) for r in podgroups.resources] == [
        ("podgroups", True),
        ("podgroups/status", True),
    ]


def test_unknown_paths_are_404_status(fake_api_sync_client: Any) -> None:
    with pytest.raises(ApiException) as err:
        client.CustomObjectsApi(fake_api_sync_client).list_cluster_custom_object(
            "nope.example.com", "v1", "things"
        )
    assert err.value.status == 404
    assert json.loads(err.value.body) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "the server could not find the requested resource",
        "reason": "NotFound",
        "details": {},
        "code": 404,
    }


def test_health_endpoints(fake_api_thread: Any) -> None:
    for path in ("/healthz", "/readyz", "/livez"):
        with urllib.request.urlopen(fake_api_thread.url + path, timeout=5) as response:
            assert (response.status, response.read()) == (200, b"ok")
