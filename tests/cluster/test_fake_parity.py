"""The fake API server (tests/support/fakeapi) against kube-apiserver v1.35: the same requests to
both, the same answers. Each case is a difference the real server showed and the fake once lacked;
where they disagree the real one is right, and the fake is fixed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.harness import ClusterEnv
from tests.support.controlplane import ApiStatus, Rest
from tests.support.fakeapi import FakeApiServer, ServerThread

EVENTS = "/apis/events.k8s.io/v1/namespaces/default/events"


def event(meta: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": meta,
        "eventTime": "2026-11-26T05:00:00.000000Z",
        "reportingController": "topoalloc.io/allocator",
        "reportingInstance": "parity",
        "action": "Scheduling",
        "reason": "FailedDeviceAllocation",
        "type": "Warning",
        "note": "parity",
        "regarding": {"apiVersion": "v1", "kind": "Pod", "namespace": "default", "name": "p"},
    }


@pytest.fixture(scope="module")
def fake() -> Iterator[Rest]:
    with ServerThread(FakeApiServer()) as server:
        yield Rest(server.url)


def answer(
    rest: Rest, method: str, path: str, body: Any, content_type: str = "application/json"
) -> tuple[int, Any]:
    try:
        return 200, rest.request(method, path, body, content_type=content_type)
    except ApiStatus as exc:
        return exc.status, exc.body


@pytest.mark.parametrize(
    ("case", "meta"),
    [
        ("generateName ending in '.'", {"generateName": "pod-0."}),
        ("generateName ending in '-'", {"generateName": "pod-0-"}),
        ("generateName longer than 58", {"generateName": "p" * 70 + "-"}),
        ("generateName and the name it makes both invalid", {"generateName": "Pod-"}),
        ("generateName valid, the name it makes invalid", {"generateName": "a.-"}),
        ("name ending in '.'", {"name": "pod-0."}),
    ],
)
def test_event_names(cluster: ClusterEnv, fake: Rest, case: str, meta: dict[str, Any]) -> None:
    real_status, real = answer(cluster.cp.admin, "POST", EVENTS, event(meta))
    fake_status, mock = answer(fake, "POST", EVENTS, event(meta))
    assert (fake_status, real_status) in ((200, 200), (422, 422)), (case, real, mock)
    if real_status == 422:
        fields = [c["field"] for c in real["details"]["causes"]]
        assert [c["field"] for c in mock["details"]["causes"]] == fields, (case, real, mock)
        assert mock["reason"] == real["reason"] == "Invalid"
    else:
        real_name, fake_name = real["metadata"]["name"], mock["metadata"]["name"]
        assert len(real_name) == len(fake_name) and real_name[:-5] == fake_name[:-5], (real_name, fake_name)


def test_custom_resources_pruned_by_their_schema(cluster: ClusterEnv, fake: Rest) -> None:
    """kube-apiserver drops what the CRD's schema does not declare, silently; so does the fake."""
    devices = "/apis/scheduling.koordinator.sh/v1alpha1/devices"
    body = {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Device",
        "metadata": {"name": "parity-prune"},
        "spec": {"devices": [{"type": "gpu", "minor": 0, "health": True, "bogus": 1}], "extra": {"a": 1}},
        "unknownRoot": True,
    }
    stored = []
    for rest in (cluster.cp.admin, fake):
        created = rest.post(devices, body)
        created["status"] = {"summary": {"gpus": 1}, "conditions": [{"type": "Ready"}]}
        updated = rest.put(f"{devices}/parity-prune/status", created)
        stored.append({k: v for k, v in updated.items() if k != "metadata"})
    for rest in (cluster.cp.admin, fake):  # the fake outlives a release's cluster: both go
        rest.delete(f"{devices}/parity-prune")
    real, mock = stored
    assert real == mock
    assert real["spec"] == {"devices": [{"type": "gpu", "minor": 0, "health": True}]}
    assert real["status"] == {"summary": {"gpus": 1}}


def test_a_gates_removal_and_the_patches_refused_around_it(cluster: ClusterEnv, fake: Rest) -> None:
    """What allocator/runtime/gates.py leans on: a merge patch naming another pod's uid is refused as
    a change of the uid (422, where a PUT's uid is a 409 precondition), a gate added after creation
    is refused, and the pod's only gate goes with a merge patch setting the list to null."""
    pods = "/api/v1/namespaces/default/pods"
    gate = [{"name": "topoalloc.io/dra"}]
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "parity-gates"},
        "spec": {"schedulingGates": gate, "containers": [{"name": "c", "image": "cuda"}]},
    }
    other = "00000000-0000-0000-0000-000000000000"
    cluster.cp.ensure_default_service_account("default")
    seen = []
    for rest in (cluster.cp.admin, fake):
        uid = rest.post(pods, body)["metadata"]["uid"]
        path = f"{pods}/parity-gates"

        def merge(patch: dict[str, Any], rest: Rest = rest, path: str = path) -> tuple[int, Any]:
            return answer(rest, "PATCH", path, patch, content_type="application/merge-patch+json")

        added = merge({"spec": {"schedulingGates": [*gate, {"name": "example.com/late"}]}})
        stranger = merge({"metadata": {"uid": other}, "spec": {"schedulingGates": None}})
        removed = merge({"metadata": {"uid": uid}, "spec": {"schedulingGates": None}})
        again = merge({"metadata": {"uid": uid}, "spec": {"schedulingGates": None}})
        rest.delete(path)
        seen.append(
            [
                (
                    status,
                    [c["field"] for c in got["details"]["causes"]]
                    if status == 422
                    else got["spec"].get("schedulingGates"),
                )
                for status, got in (added, stranger, removed, again)
            ]
        )
    real, mock = seen
    assert mock == real
    assert real == [
        (422, ["spec.schedulingGates[1].name"]),
        (422, ["metadata.uid", "metadata.uid"]),  # the registry's check and the pod's own
        (200, None),
        (200, None),
    ]
