"""The client's one write path against the fake API server: `KubeApi.patch` / `create` /
`create_or_replace` answer Written or Refused(reason, status) and say a refusal once, at WARNING;
`remove_gate` removes exactly one scheduling gate of exactly one pod (allocator/runtime/gates.py)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from allocator.runtime.gates import PodGates, remove_gate
from allocator.runtime.kube import JSON_PATCH, ApiError, KubeApi, Refused, Written
from apis.kinds import LEASES, PODS
from tests.support.fakeapi import FakeApiServer

KUBE_LOG = "allocator.runtime.kube"


@pytest.fixture
async def api(fake_api: FakeApiServer) -> AsyncIterator[KubeApi]:
    client = await KubeApi.connect(host=fake_api.url)
    yield client
    await client.close()


def pod(name: str, gates: list[str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "x"}]}
    if gates is not None:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }


def gates_of(fake_api: FakeApiServer, name: str) -> list[str] | None:
    found = fake_api.get("pods", name, "default")
    assert found is not None
    gates = found["spec"].get("schedulingGates")
    return None if gates is None else [g["name"] for g in gates]


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == KUBE_LOG and r.levelno == logging.WARNING]


async def test_a_patch_taken_is_written_with_the_object_as_written(
    fake_api: FakeApiServer, api: KubeApi
) -> None:
    made = fake_api.put(pod("p"))
    body = {"metadata": {"uid": made["metadata"]["uid"], "annotations": {"a": "1"}}}
    got = await api.patch(PODS.path("p", namespace="default"), body, what="annotating p")
    assert isinstance(got, Written) and got
    assert got.object["metadata"]["annotations"] == {"a": "1"}
    assert got.resource_version == fake_api.get("pods", "p", "default")["metadata"]["resourceVersion"]
    assert got.resource_version != made["metadata"]["resourceVersion"]


async def test_a_refused_patch_says_why_once_and_writes_nothing(
    fake_api: FakeApiServer, api: KubeApi, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=KUBE_LOG)
    fake_api.put(pod("p"))
    # A patch naming the uid of another incarnation of the pod: 422 (kube-apiserver refuses it as a
    # change of the uid, tests/cluster/test_fake_parity.py), and the pod keeps its annotations.
    body = {"metadata": {"uid": "0000-other", "annotations": {"a": "1"}}}
    got = await api.patch(PODS.path("p", namespace="default"), body, what="annotating default/p")
    assert isinstance(got, Refused) and not got
    assert (got.reason, got.status) == ("Invalid", 422)
    assert "metadata.uid" in got.message and "field is immutable" in got.message
    assert "annotations" not in fake_api.get("pods", "p", "default")["metadata"]
    [said] = warnings(caplog)
    assert said.startswith("annotating default/p: 422 Invalid: ") and "field is immutable" in said


async def test_quiet_statuses_and_what_none_are_not_logged(
    fake_api: FakeApiServer, api: KubeApi, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=KUBE_LOG)
    path = PODS.path("gone", namespace="default")
    got = await api.patch(path, {"metadata": {"labels": {"a": "1"}}}, what="labelling gone", quiet=(404,))
    assert (got.reason, got.status) == ("NotFound", 404)
    got = await api.patch(path, {"metadata": {"labels": {"a": "1"}}}, what=None)
    assert (got.reason, got.status) == ("NotFound", 404)
    assert warnings(caplog) == []
    await api.patch(path, {"metadata": {"labels": {"a": "1"}}}, what="labelling gone")
    assert len(warnings(caplog)) == 1


@pytest.mark.parametrize(("status", "reason"), [(404, "NotFound"), (409, "Conflict"), (422, "Invalid")])
async def test_a_status_without_a_reason_gets_kube_apiservers(
    fake_api: FakeApiServer, api: KubeApi, status: int, reason: str
) -> None:
    fake_api.put(pod("p"))
    fake_api.inject_fault("PATCH", "/pods/p$", status=status, body={"kind": "Status", "code": status})
    got = await api.patch(
        PODS.path("p", namespace="default"), {"metadata": {"labels": {"a": "1"}}}, what=None
    )
    assert isinstance(got, Refused)
    assert (got.reason, got.status) == (reason, status)


async def test_a_failed_json_patch_test_is_invalid_and_or_raise_raises_it(
    fake_api: FakeApiServer, api: KubeApi
) -> None:
    fake_api.put(pod("p", ["a"]))
    ops = [{"op": "test", "path": "/spec/schedulingGates/0/name", "value": "b"}]
    got = await api.patch(PODS.path("p", namespace="default"), ops, content_type=JSON_PATCH, what=None)
    assert (got.reason, got.status) == ("Invalid", 422)
    with pytest.raises(ApiError) as raised:
        got.or_raise()
    assert raised.value.status == 422 and str(raised.value) == str(got)


async def test_create_refuses_an_existing_name_and_create_or_replace_replaces(
    fake_api: FakeApiServer, api: KubeApi
) -> None:
    # Any namespaced kind (the defrag report is a ConfigMap, which the fake API server does not serve).
    body = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "r", "namespace": "default"},
    }
    made = await api.create_or_replace(LEASES, {**body, "spec": {"holderIdentity": "a"}}, what="writing r")
    assert made and fake_api.get("leases", "r", "default")["spec"] == {"holderIdentity": "a"}
    again = await api.create(LEASES.path(namespace="default"), body, what=None)
    assert (again.reason, again.status) == ("AlreadyExists", 409)
    fake_api.clear_requests()
    replaced = await api.create_or_replace(
        LEASES, {**body, "spec": {"holderIdentity": "b"}}, what="writing r"
    )
    assert replaced and fake_api.get("leases", "r", "default")["spec"] == {"holderIdentity": "b"}
    assert [r.method for r in fake_api.requests()] == ["PUT"]  # one request once it exists


# -- remove_gate ------------------------------------------------------------------------------------


def gated(fake_api: FakeApiServer, name: str, gates: list[str]) -> PodGates:
    made = fake_api.put(pod(name, gates))
    return PodGates("default", name, made["metadata"]["uid"], tuple(gates))


async def test_the_only_gate_goes_with_its_list(fake_api: FakeApiServer, api: KubeApi) -> None:
    p = gated(fake_api, "p", ["topoalloc.io/gang"])
    fake_api.clear_requests()
    assert await remove_gate(api, p, "topoalloc.io/gang")
    assert gates_of(fake_api, "p") is None
    # A merge patch naming the uid (kube-apiserver spends less on it than on a JSON patch's tests).
    [sent] = fake_api.requests("PATCH")
    assert sent.content_type == "application/merge-patch+json"
    assert sent.body == {"metadata": {"uid": p.uid}, "spec": {"schedulingGates": None}}
    # Removed meanwhile by someone else: the pod is ungated, which is what was asked.
    assert await remove_gate(api, p, "topoalloc.io/gang")
    assert gates_of(fake_api, "p") is None


async def test_one_of_several_gates_goes_and_the_others_stay_in_order(
    fake_api: FakeApiServer, api: KubeApi
) -> None:
    p = gated(fake_api, "p", ["example.com/a", "topoalloc.io/gang", "example.com/b"])
    assert await remove_gate(api, p, "topoalloc.io/gang")
    assert gates_of(fake_api, "p") == ["example.com/a", "example.com/b"]


async def test_gates_that_moved_since_they_were_read_refuse_the_removal(
    fake_api: FakeApiServer, api: KubeApi
) -> None:
    # Read with ours second; someone removed the first meanwhile, so ours is first now and the
    # second is another gate: the index test fails and no gate is removed.
    p = gated(fake_api, "p", ["example.com/a", "topoalloc.io/dra", "example.com/b"])
    now = fake_api.get("pods", "p", "default")
    now["spec"]["schedulingGates"] = [{"name": "topoalloc.io/dra"}, {"name": "example.com/b"}]
    fake_api.put(now)
    assert not await remove_gate(api, p, "topoalloc.io/dra")
    assert gates_of(fake_api, "p") == ["topoalloc.io/dra", "example.com/b"]
    # (A gate added after the pod's creation, behind the read of its only gate, cannot happen:
    # kube-apiserver lets gates only be removed then, tests/cluster/test_gates_real.py.)


async def test_a_pod_made_again_under_the_name_keeps_its_gate(fake_api: FakeApiServer, api: KubeApi) -> None:
    old = gated(fake_api, "p", ["topoalloc.io/gang"])
    fake_api.remove("pods", "p", "default")
    fake_api.put(pod("p", ["topoalloc.io/gang"]))
    assert not await remove_gate(api, old, "topoalloc.io/gang")
    assert gates_of(fake_api, "p") == ["topoalloc.io/gang"]


async def test_the_servers_clock_is_its_date_header(api: KubeApi) -> None:
    """Not a write: the read `topoalloc doctor` judges ages by (the Date header of GET /version)."""
    import time

    said = await api.server_time()
    assert said is not None and abs(said - time.time()) < 5 and said == int(said)
