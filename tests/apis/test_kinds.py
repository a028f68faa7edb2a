"""The one table of API paths (apis/kinds.py): every path the product sends is built here."""

from __future__ import annotations

import pytest

from apis.kinds import (
    EVENTS,
    NODES,
    PODS,
    RESERVATIONS,
    RESOURCECLAIMS,
    Kind,
    api_root,
)


def test_paths_of_objects_subresources_and_collections() -> None:
    assert PODS.path("p", namespace="ns", subresource="eviction") == "/api/v1/namespaces/ns/pods/p/eviction"
    assert PODS.path(namespace="ns") == "/api/v1/namespaces/ns/pods"
    assert PODS.path() == "/api/v1/pods"  # across all namespaces
    assert NODES.path("n1", subresource="status") == "/api/v1/nodes/n1/status"
    assert RESERVATIONS.path("r") == "/apis/scheduling.koordinator.sh/v1alpha1/reservations/r"
    assert (
        RESOURCECLAIMS.path("c", namespace="ns", subresource="status")
        == "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status"
    )
    assert EVENTS.path(namespace="default") == "/apis/events.k8s.io/v1/namespaces/default/events"


def test_discovery_roots() -> None:
    assert api_root("v1") == "/api/v1" == NODES.root
    assert api_root("apps/v1") == "/apis/apps/v1"
    assert RESERVATIONS.root == "/apis/scheduling.koordinator.sh/v1alpha1"


def test_a_name_is_one_path_segment() -> None:
    assert PODS.path("a/b", namespace="x?y") == "/api/v1/namespaces/x%3Fy/pods/a%2Fb"


@pytest.mark.parametrize(
    ("kind", "name", "namespace", "subresource"),
    [
        (NODES, "n", "ns", ""),  # cluster-scoped: no namespace
        (PODS, "p", "", ""),  # namespaced: an object needs its namespace
        (PODS, "", "ns", "status"),  # a subresource needs an object
    ],
)
def test_paths_that_name_nothing_real_are_refused(
    kind: Kind, name: str, namespace: str, subresource: str
) -> None:
    with pytest.raises(ValueError):
        kind.path(name, namespace=namespace, subresource=subresource)
