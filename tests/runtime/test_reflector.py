"""The reflector against the fake API server over HTTP: sync, resume, bookmarks, both forms of
410, backoff on errors, a missing CRD, and an alpha API served only later."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from allocator.runtime.cache.reflector import Backoff, Reflector
from allocator.runtime.kube import NATIVE_PODGROUPS, NODES, PDBS, Kind, KubeApi
from allocator.runtime.metrics import Metrics
from tests.support.fakeapi import FakeApiServer
from tests.support.fakeapi.builtin import native_gang_types
from tests.support.polling import until

JSON = dict[str, Any]


class RecordingSink:
    """Keeps the objects by name, as a cache would, and logs what the reflector told it."""

    def __init__(self) -> None:
        self.objects: dict[str, JSON] = {}
        self.log: list[tuple[str, str]] = []

    def replace(self, kind: Kind, items: list[JSON]) -> None:
        self.log.append(("REPLACE", ",".join(sorted(i["metadata"]["name"] for i in items))))
        self.objects = {i["metadata"]["name"]: i for i in items}

    def apply(self, kind: Kind, event_type: str, obj: JSON) -> None:
        name = obj["metadata"]["name"]
        self.log.append((event_type, name))
        if event_type == "DELETED":
            self.objects.pop(name, None)
        else:
            self.objects[name] = obj


def node(name: str, **labels: str) -> JSON:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


@pytest.fixture
async def api(fake_api: FakeApiServer) -> AsyncIterator[KubeApi]:
    client = await KubeApi.connect(host=fake_api.url)
    yield client
    await client.close()


async def run_reflector(
    api: KubeApi, kind: Kind, **kwargs: Any
) -> tuple[Reflector, RecordingSink, asyncio.Task]:
    sink = RecordingSink()
    reflector = Reflector(api, kind, sink, backoff=Backoff(0.05, 0.4), **kwargs)
    task = asyncio.create_task(reflector.run())
    await asyncio.wait_for(reflector.synced.wait(), 5)
    return reflector, sink, task


async def stop(task: asyncio.Task) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_lists_then_follows_the_watch(fake_api: FakeApiServer, api: KubeApi) -> None:
    fake_api.put(node("a"))
    fake_api.put(node("b"))
    reflector, sink, task = await run_reflector(api, NODES)
    try:
        assert sink.log == [("REPLACE", "a,b")]
        assert reflector.has_synced
        await fake_api.wait_for_watches(1)
        fake_api.put(node("c"))
        fake_api.put(node("a", gpu="yes"))
        fake_api.remove("nodes", "b")
        await until(lambda: set(sink.objects) == {"a", "c"})
        assert sink.objects["a"]["metadata"]["labels"] == {"gpu": "yes"}
        assert sink.log[1:] == [("ADDED", "c"), ("MODIFIED", "a"), ("DELETED", "b")]
        assert reflector.resource_version == fake_api.resource_version
        assert reflector.lists == 1
    finally:
        await stop(task)


async def test_resumes_from_the_last_resource_version_without_relisting(
    fake_api: FakeApiServer, api: KubeApi
) -> None:
    fake_api.put(node("a"))
    reflector, sink, task = await run_reflector(api, NODES)
    try:
        await fake_api.wait_for_watches(1)
        assert fake_api.break_watches() == 1
        fake_api.put(node("b"))  # happens while no watch is open
        await until(lambda: "b" in sink.objects)
        assert reflector.lists == 1 and reflector.watches >= 2
        watches = [r for r in fake_api.requests(method="GET") if r.watch]
        assert watches[-1].query["resourceVersion"] != "0"
        assert watches[-1].query["allowWatchBookmarks"] == "true"
    finally:
        await stop(task)


async def test_bookmarks_advance_the_resource_version(fake_api: FakeApiServer, api: KubeApi) -> None:
    fake_api.put(node("a"))
    reflector, _sink, task = await run_reflector(api, NODES)
    try:
        listed = reflector.resource_version
        # A change to another kind moves the global resourceVersion; only a BOOKMARK tells the
        # Node watch about it (the fake sends one every 0.3 s here).
        fake_api.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "elsewhere"}})
        await until(lambda: reflector.resource_version == fake_api.resource_version)
        assert reflector.resource_version != listed
    finally:
        await stop(task)


async def test_watch_410_error_event_relists_and_finds_deletions(
    fake_api: FakeApiServer, api: KubeApi
) -> None:
    for name in "abc":
        fake_api.put(node(name))
    metrics = Metrics()
    reflector, sink, task = await run_reflector(api, NODES, metrics=metrics)
    try:
        await fake_api.wait_for_watches(1)
        fake_api.break_watches()
        # While nothing watches: b goes away, d appears, and the history is compacted, so the
        # resume gets HTTP 200 with an ERROR event of code 410.
        fake_api.remove("nodes", "b")
        fake_api.put(node("d"))
        fake_api.compact()
        await until(lambda: reflector.lists == 2)
        assert set(sink.objects) == {"a", "c", "d"}
        assert ("REPLACE", "a,c,d") in sink.log
        assert (
            metrics.registry.get_sample_value(
                "topoalloc_cache_relists_total", {"kind": "Node", "cause": "expired"}
            )
            == 1
        )
        # ...and it watches again from the new list.
        fake_api.put(node("e"))
        await until(lambda: "e" in sink.objects)
    finally:
        await stop(task)


async def test_http_410_on_list_is_retried(fake_api: FakeApiServer, api: KubeApi) -> None:
    fake_api.put(node("a"))
    fault = fake_api.inject_fault("GET", r"^/api/v1/nodes$", watch=False, status=410, times=1)
    reflector, sink, task = await run_reflector(api, NODES)
    try:
        assert fault.hits == 1
        assert set(sink.objects) == {"a"} and reflector.lists == 1
    finally:
        await stop(task)


async def test_failing_watch_backs_off(fake_api: FakeApiServer, api: KubeApi) -> None:
    fake_api.put(node("a"))
    reflector, sink, task = await run_reflector(api, NODES)
    try:
        await fake_api.wait_for_watches(1)
        fault = fake_api.inject_fault("GET", r"^/api/v1/nodes$", watch=True, status=500, times=None)
        fake_api.break_watches()
        await asyncio.sleep(1.0)
        # Backoff 0.05 s doubling to 0.4 s with jitter: a handful of attempts, not thousands.
        assert 2 <= fault.hits <= 12
        fake_api.clear_faults()
        fake_api.put(node("b"))
        await until(lambda: "b" in sink.objects)
        assert reflector.lists == 1  # a 500 resumes the watch; it does not relist
    finally:
        await stop(task)


async def test_dropped_connection_is_survived(fake_api: FakeApiServer, api: KubeApi) -> None:
    fake_api.put(node("a"))
    _reflector, sink, task = await run_reflector(api, NODES)
    try:
        await fake_api.wait_for_watches(1)
        fake_api.break_watches(abort=True)
        fake_api.put(node("b"))
        await until(lambda: "b" in sink.objects)
    finally:
        await stop(task)


async def test_missing_crd_counts_as_an_empty_synced_kind(fake_api: FakeApiServer, api: KubeApi) -> None:
    not_installed = Kind("Widget", "example.com", "v1", "widgets")
    reflector, sink, task = await run_reflector(api, not_installed)
    try:
        assert reflector.has_synced and reflector.missing
        assert sink.objects == {}
    finally:
        await stop(task)


async def test_large_objects_and_paged_lists(fake_api: FakeApiServer, api: KubeApi) -> None:
    big = node("big")
    big["metadata"]["annotations"] = {"example.com/blob": "x" * 200_000}  # beyond aiohttp's line limit
    fake_api.put(node("a"))
    _reflector, sink, task = await run_reflector(api, NODES)
    try:
        await fake_api.wait_for_watches(1)
        fake_api.put(big)
        await until(lambda: "big" in sink.objects)
        assert len(sink.objects["big"]["metadata"]["annotations"]["example.com/blob"]) == 200_000
    finally:
        await stop(task)
    for i in range(5):
        fake_api.put(node(f"n{i}"))
    items, rv = await api.list(NODES, page_size=2)
    assert sorted(i["metadata"]["name"] for i in items) == ["a", "big", "n0", "n1", "n2", "n3", "n4"]
    assert rv == fake_api.resource_version
    assert len([r for r in fake_api.requests(method="GET") if r.query.get("limit") == "2"]) == 4


async def test_an_optional_kind_rbac_forbids_counts_as_empty(fake_api: FakeApiServer, api: KubeApi) -> None:
    """An allocator whose ClusterRole predates the PodDisruptionBudget rule still gets ready: the
    forbidden LIST is an empty synced set (and asked again later); a required kind is not."""
    fake_api.inject_fault(path="poddisruptionbudgets", status=403, times=None)
    reflector, sink, task = await run_reflector(api, PDBS)
    try:
        assert reflector.has_synced and reflector.missing and sink.objects == {}
    finally:
        await stop(task)
    fake_api.inject_fault(path="/api/v1/nodes", status=403, times=None)
    reflector = Reflector(api, NODES, RecordingSink(), backoff=Backoff(0.01, 0.02))
    task = asyncio.create_task(reflector.run())
    try:
        await asyncio.sleep(0.2)
        assert not reflector.has_synced
    finally:
        await stop(task)


async def test_an_alpha_api_is_discovered_before_it_is_listed_and_found_once_served(
    fake_api: FakeApiServer, api: KubeApi
) -> None:
    reflector, sink, task = await run_reflector(api, NATIVE_PODGROUPS)
    try:
        assert reflector.has_synced and reflector.missing and sink.objects == {}
        assert not [
            r for r in fake_api.requests(method="GET") if r.path.endswith("/podgroups")
        ]  # asked first
        fake_api.serve(*native_gang_types("v1alpha2"))  # the server restarts with the gates on
        fake_api.put(
            {
                "apiVersion": "scheduling.k8s.io/v1alpha2",
                "kind": "PodGroup",
                "metadata": {"name": "pg1", "namespace": "default"},
                "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}},
            }
        )
        await until(lambda: "pg1" in sink.objects)
        assert not reflector.missing
    finally:
        await stop(task)
