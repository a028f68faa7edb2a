"""Events: one store shown as core/v1 and events.k8s.io/v1, with the stricter v1 validation."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from kubernetes.aio import client

from tests.support.fakeapi import FakeApiServer

from .streams import events


def _v1_event(name: str, **overrides: Any) -> dict[str, Any]:
    body = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": "default"},
        "eventTime": "2026-11-22T02:32:46.000000Z",
        "reportingController": "topoalloc.io/allocator",
        "reportingInstance": "allocator-0",
        "action": "Binding",
        "reason": "FailedPlacement",
        "type": "Warning",
        "note": "no node has 8 GPUs on one NVLink domain",
        "regarding": {"kind": "Pod", "namespace": "default", "name": "w1", "uid": "u-1"},
    }
    body.update(overrides)
    return body


async def test_v1_event_is_visible_through_the_core_api(fake_api_aio_client: Any) -> None:
    events_api = client.EventsV1Api(fake_api_aio_client)
    core = client.CoreV1Api(fake_api_aio_client)
    await events_api.create_namespaced_event("default", _v1_event("e1"))
    [event] = (await core.list_namespaced_event("default", field_selector="involvedObject.name=w1")).items
    assert event.message == "no node has 8 GPUs on one NVLink domain"
    assert (event.involved_object.kind, event.involved_object.name) == ("Pod", "w1")
    assert event.reporting_component == "topoalloc.io/allocator"
    assert event.type == "Warning"
    again = await events_api.read_namespaced_event("e1", "default")
    assert again.note == event.message and again.regarding.name == "w1"


async def test_core_event_is_visible_as_events_k8s_io(fake_api_aio_client: Any) -> None:
    core = client.CoreV1Api(fake_api_aio_client)
    await core.create_namespaced_event(
        "default",
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": "e2"},
            "involvedObject": {"kind": "Node", "name": "n1"},
            "reason": "DeviceUnhealthy",
            "message": "GPU 3: XID 79",
            "type": "Warning",
            "count": 2,
            "source": {"component": "topoalloc-agent"},
        },
    )
    # Raw read: the typed EventsV1Event model requires eventTime, which a core-created event lacks (the
    # apiserver writes it as null too), so the official client's typed list fails on such events.
    response = await client.EventsV1Api(fake_api_aio_client).list_namespaced_event_without_preload_content(
        "default"
    )
    [shown] = json.loads(await response.read())["items"]
    assert (shown["note"], shown["regarding"]["name"], shown["deprecatedCount"]) == ("GPU 3: XID 79", "n1", 2)
    assert shown["deprecatedSource"] == {"component": "topoalloc-agent"}
    assert shown["eventTime"] is None


async def test_v1_validation(fake_api: FakeApiServer) -> None:
    """Sent with plain aiohttp: the official client refuses to send such an event at all."""
    body = _v1_event("bad", eventTime=None, reportingController="", type="Sideways")
    async with aiohttp.ClientSession() as session:
        url = f"{fake_api.url}/apis/events.k8s.io/v1/namespaces/default/events"
        async with session.post(url, json=body) as response:
            status = await response.json()
    assert response.status == 422
    assert [c["field"] for c in status["details"]["causes"]] == ["eventTime", "type", "reportingController"]
    assert status["message"].startswith('Event.events.k8s.io "bad" is invalid: [eventTime: Required value, ')


async def test_watch_through_either_view(fake_api: FakeApiServer, fake_api_aio_client: Any) -> None:
    start = fake_api.resource_version
    v1_watch = await client.EventsV1Api(fake_api_aio_client).list_namespaced_event_without_preload_content(
        "default", watch=True, resource_version=start, timeout_seconds=10
    )
    core_watch = await client.CoreV1Api(fake_api_aio_client).list_namespaced_event_without_preload_content(
        "default", watch=True, resource_version=start, timeout_seconds=10
    )
    await client.EventsV1Api(fake_api_aio_client).create_namespaced_event("default", _v1_event("e3"))
    [as_v1] = await events(v1_watch, 1)
    [as_core] = await events(core_watch, 1)
    assert (as_v1["object"]["apiVersion"], as_v1["object"]["note"]) == (
        "events.k8s.io/v1",
        _v1_event("e3")["note"],
    )
    assert (as_core["object"]["apiVersion"], as_core["object"]["message"]) == ("v1", _v1_event("e3")["note"])
    assert as_v1["object"]["metadata"]["resourceVersion"] == as_core["object"]["metadata"]["resourceVersion"]
    v1_watch.release()
    core_watch.release()


async def test_put_creates_a_missing_event(fake_api: FakeApiServer) -> None:
    """Events allow create-on-update: a PUT of a missing event answers 201."""
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "e4", "namespace": "default"},
        "involvedObject": {"kind": "Pod", "name": "w1"},
        "reason": "Scheduled",
        "message": "bound",
    }
    async with fake_api.aio_api_client() as api:
        core = client.CoreV1Api(api)
        response = await core.replace_namespaced_event_without_preload_content("e4", "default", body)
        assert response.status == 201
        again = await core.replace_namespaced_event("e4", "default", {**body, "message": "bound again"})
    assert again.message == "bound again"


async def test_generate_name_must_itself_be_a_valid_prefix(fake_api: FakeApiServer) -> None:
    """Pinned against kube-apiserver v1.35 (tests/cluster/test_fake_parity.py): a generateName
    ending in '.' is refused with 422 on metadata.generateName, though the name it would make is
    valid; one ending in '-' is the usual form; long prefixes are cut to 58 characters."""
    url = f"{fake_api.url}/apis/events.k8s.io/v1/namespaces/default/events"
    async with aiohttp.ClientSession() as http:
        body = _v1_event("")
        body["metadata"] = {"generateName": "full-0.", "namespace": "default"}
        async with http.post(url, json=body) as resp:
            assert resp.status == 422
            status = await resp.json()
        assert status["reason"] == "Invalid"
        [cause] = status["details"]["causes"]
        assert cause["field"] == "metadata.generateName"
        assert 'Invalid value: "full-0."' in status["message"]

        body["metadata"] = {"generateName": "full-0-", "namespace": "default"}
        async with http.post(url, json=body) as resp:
            assert resp.status == 201
            assert (await resp.json())["metadata"]["name"].startswith("full-0-")

        body["metadata"] = {"generateName": "p" * 70 + "-", "namespace": "default"}
        async with http.post(url, json=body) as resp:
            assert resp.status == 201
            name = (await resp.json())["metadata"]["name"]
        assert name.startswith("p" * 58) and len(name) == 63
