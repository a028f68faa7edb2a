"""Pod Events through events.k8s.io/v1 against the fake API server: written once, aggregated,
rate-limited."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest

from allocator.runtime.events import CONTROLLER, EventRecorder, PodRef
from allocator.runtime.kube import KubeApi
from allocator.runtime.metrics import Metrics
from tests.support.fakeapi import FakeApiServer


@pytest.fixture
async def api(fake_api: FakeApiServer) -> AsyncIterator[KubeApi]:
    client = await KubeApi.connect(host=fake_api.url)
    yield client
    await client.close()


POD = PodRef("default", "trainer-0", "0271474f-01cc-4283-9195-2a43de63bcb1")


async def test_repeats_are_one_event_with_a_series_count(fake_api: FakeApiServer, api: KubeApi) -> None:
    metrics = Metrics()
    rec = EventRecorder(api, instance="allocator-a", window=60, metrics=metrics)
    for _ in range(500):  # e.g. 500 retries of the same pod, same cause
        rec.warn(POD, "FailedDeviceAllocation", "Scheduling", "0/5000 nodes can host the pod's devices: …")
    await rec.drain()
    events = (await api.raw("GET", "/apis/events.k8s.io/v1/namespaces/default/events"))["items"]
    assert len(events) == 1
    ev = events[0]
    assert ev["reportingController"] == CONTROLLER and ev["reportingInstance"] == "allocator-a"
    assert ev["type"] == "Warning" and ev["reason"] == "FailedDeviceAllocation"
    assert ev["regarding"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "default",
                               "name": "trainer-0", "uid": POD.uid}  # fmt: skip
    assert ev["series"]["count"] == 500
    assert ev["metadata"]["name"].startswith("trainer-0-")  # generateName "trainer-0." is a 422
    assert metrics.registry.get_sample_value("topoalloc_events_total", {"result": "aggregated"}) == 499


async def test_distinct_causes_are_distinct_events_and_the_rate_is_capped(
    fake_api: FakeApiServer, api: KubeApi
) -> None:
    rec = EventRecorder(api, instance="allocator-a", rate=1.0, burst=5)
    for i in range(50):
        rec.warn(PodRef("default", f"pod-{i}", f"uid-{i}"), "FailedBinding", "Binding", f"cause {i}")
    await rec.drain()
    assert rec.written == 5  # the burst; the rest are dropped rather than flood the API server
    assert len(fake_api.requests(method="POST")) == 5


async def test_one_object_is_capped_on_its_own_and_others_still_get_theirs(
    fake_api: FakeApiServer, api: KubeApi
) -> None:
    """client-go's spam filter: 25 Events per object, then one per 5 minutes; a gang's burst of
    one Event per member (100 members) and a one-off about its PodGroup are all written."""
    now = [0.0]
    rec = EventRecorder(api, instance="allocator-a", clock=lambda: now[0])
    for i in range(40):
        rec.warn(POD, "FailedBinding", "Binding", f"cause {i}")
    for i in range(100):
        rec.warn(PodRef("default", f"member-{i}", f"uid-m{i}"), "GangWaiting", "Scheduling", "waits")
    rec.record(PodRef("default", "gang", "uid-g", kind="PodGroup"), "Normal", "GangPlanned", "Planning", "ok")
    await rec.drain()
    events = (await api.raw("GET", "/apis/events.k8s.io/v1/namespaces/default/events"))["items"]
    about = [e["regarding"]["name"] for e in events]
    assert about.count("trainer-0") == 25
    assert sum(name.startswith("member-") for name in about) == 100 and "gang" in about
    now[0] = 301.0  # one more for the capped object once its bucket refilled
    rec.warn(POD, "FailedBinding", "Binding", "cause 40")
    await rec.drain()
    events = (await api.raw("GET", "/apis/events.k8s.io/v1/namespaces/default/events"))["items"]
    assert [e["regarding"]["name"] for e in events].count("trainer-0") == 26


async def test_a_cause_dropped_by_the_cap_is_written_when_it_repeats(
    fake_api: FakeApiServer, api: KubeApi
) -> None:
    """A burst of other Events spent the bucket when this cause first came: its repeat, once the
    bucket refilled, writes it (it is not counted into an Event that was never written)."""
    now = [0.0]
    rec = EventRecorder(api, instance="allocator-a", rate=1.0, burst=1, clock=lambda: now[0])
    late = PodRef("default", "late", "uid-late")
    rec.warn(POD, "FailedBinding", "Binding", "first")
    rec.warn(late, "DRAAllocationFailed", "Allocating", "the gang does not fit whole")
    await rec.drain()
    assert rec.written == 1
    now[0] = 5.0
    rec.warn(late, "DRAAllocationFailed", "Allocating", "the gang does not fit whole")
    await rec.drain()
    events = (await api.raw("GET", "/apis/events.k8s.io/v1/namespaces/default/events"))["items"]
    assert sorted(e["regarding"]["name"] for e in events) == ["late", "trainer-0"]


async def test_a_failing_api_never_reaches_the_caller(
    fake_api: FakeApiServer, api: KubeApi, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="allocator.runtime.events")
    metrics = Metrics()
    rec = EventRecorder(api, instance="allocator-a", metrics=metrics)
    fake_api.inject_fault("POST", "/events", status=500, times=None)
    task = asyncio.create_task(rec.run())
    try:
        rec.warn(POD, "FailedBinding", "Binding", "boom")
        for _ in range(100):
            if metrics.registry.get_sample_value("topoalloc_events_total", {"result": "failed"}):
                break
            await asyncio.sleep(0.01)
        assert metrics.registry.get_sample_value("topoalloc_events_total", {"result": "failed"}) == 1
        assert not task.done()
        # A lost Event is said at WARNING: below it, nobody would learn that users see none.
        [record] = [r for r in caplog.records if "not written" in r.getMessage()]
        assert record.levelno == logging.WARNING and "default/trainer-0" in record.getMessage()
    finally:
        task.cancel()
