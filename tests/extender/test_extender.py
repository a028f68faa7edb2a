"""The extender verbs end to end: kube-scheduler's JSON over mTLS, the real core, the real watch
cache fed by the fake API server, binding through the API."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.extender.handlers.common import dumps, loads
from allocator.extender.handlers.prioritize import host_priority_list
from apis import keys
from tests.support.allocator_harness import allocated, double_booked, pod, running_allocator, seed_nodes
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Pki
from tests.support.polling import until


async def test_filter_prioritize_bind_one_pod(fake_api: FakeApiServer, pki: Pki) -> None:
    names = seed_nodes(fake_api, ["gpu-1", "gpu-2"])
    created = fake_api.put(pod("trainer", gpus=4))
    async with running_allocator(fake_api, pki, round_trips=2) as run:  # one trip: test_round_trips.py
        c = run.client
        result = await c.filter(created, [*names, "ghost"])
        assert result["Nodes"] is None and result["NodeNames"] == names
        assert result["FailedNodes"] == {"ghost": "node is not in the allocator's cache yet"}
        scores = await c.prioritize(created, names)
        assert set(scores) == set(names) and all(0 <= s <= 10 for s in scores.values())
        assert await c.bind(created, "gpu-2") == ""
        stored = fake_api.get("pods", "trainer", "default")
        assert stored["spec"]["nodeName"] == "gpu-2"
        alloc = json.loads(allocated(stored))
        assert len(alloc["gpu"]) == 4
        await until(lambda: not run.service.cache.ledger.holds)  # the watch confirmed the bind
        assert run.service.cache.holdings() == {"default/trainer": ("gpu-2", allocated(stored))}
        assert run.metric("topoalloc_extender_requests_total", {"verb": "bind", "result": "ok"}) == 1


async def test_burst_of_40_pods_on_8_nodes_never_shares_a_gpu(fake_api: FakeApiServer, pki: Pki) -> None:
    names = seed_nodes(fake_api, [f"gpu-{i}" for i in range(8)])
    pods = [fake_api.put(pod(f"w-{i}", gpus=1 + (i // 8) % 2)) for i in range(40)]
    async with running_allocator(fake_api, pki, connections=40) as run:
        # kube-scheduler already picked nodes (5 pods per node); the 40 binds run at once.
        t0 = asyncio.get_running_loop().time()
        errors = await asyncio.gather(*(run.client.bind(p, names[i % 8]) for i, p in enumerate(pods)))
        took = asyncio.get_running_loop().time() - t0
        assert errors == [""] * 40
        assert took < 5.0
        stored = fake_api.list_objects("pods", "default")
        assert all(p["spec"].get("nodeName") for p in stored)
        assert double_booked(stored) == []
        gpus_per_node = {n: 0 for n in names}
        for p in stored:
            gpus_per_node[p["spec"]["nodeName"]] += len(json.loads(allocated(p))["gpu"])
        assert set(gpus_per_node.values()) <= {7, 8}  # 5 pods: 1+2+1+2+1 or 2+1+2+1+2


async def test_device_pod_that_fits_nowhere_gets_an_event(fake_api: FakeApiServer, pki: Pki) -> None:
    names = seed_nodes(fake_api, ["gpu-1"])
    big = fake_api.put(pod("too-big", gpus=16))
    async with running_allocator(fake_api, pki) as run:
        result = await run.client.filter(big, names)
        assert result["NodeNames"] == []
        reasons = {**result["FailedNodes"], **result["FailedAndUnresolvableNodes"]}
        assert set(reasons) == {"gpu-1"}
        await run.service.events.drain()
        events = (await run.api.raw("GET", "/apis/events.k8s.io/v1/namespaces/default/events"))["items"]
        assert len(events) == 1
        assert events[0]["regarding"]["name"] == "too-big" and reasons["gpu-1"] in events[0]["note"]


async def test_pod_without_devices_passes_everywhere(fake_api: FakeApiServer, pki: Pki) -> None:
    names = seed_nodes(fake_api, ["gpu-1", "gpu-2"])
    plain = fake_api.put(pod("plain"))
    async with running_allocator(fake_api, pki) as run:
        result = await run.client.filter(plain, [*names, "cpu-only-node"])
        assert result["NodeNames"] == [*names, "cpu-only-node"] and result["FailedNodes"] == {}
        assert await run.client.prioritize(plain, names) == {"gpu-1": 0, "gpu-2": 0}
        assert await run.client.bind(plain, "gpu-1") == ""
        stored = fake_api.get("pods", "plain", "default")
        assert stored["spec"]["nodeName"] == "gpu-1" and allocated(stored) is None


async def test_malformed_annotation_is_unresolvable_on_every_node(fake_api: FakeApiServer, pki: Pki) -> None:
    names = seed_nodes(fake_api, ["gpu-1", "gpu-2"])
    bad = fake_api.put(pod("bad-hint", gpus=1, annotations={keys.DEVICE_ALLOCATE_HINT: "{not json"}))
    async with running_allocator(fake_api, pki) as run:
        result = await run.client.filter(bad, names)
        assert result["NodeNames"] == [] and result["FailedNodes"] == {}
        messages = set(result["FailedAndUnresolvableNodes"].values())
        assert len(messages) == 1 and keys.DEVICE_ALLOCATE_HINT in messages.pop()
        error = await run.client.bind(bad, "gpu-1")
        assert keys.DEVICE_ALLOCATE_HINT in error
        assert fake_api.get("pods", "bad-hint", "default")["spec"].get("nodeName") is None


@settings(max_examples=200, deadline=None)
@given(
    names=st.lists(
        st.text(max_size=12) | st.from_regex(r"[a-z0-9][a-z0-9.\-]{0,20}", fullmatch=True), max_size=8
    ),
    score=st.integers(-(2**40), 2**40),
)
def test_host_priority_list_is_valid_json_in_kube_schedulers_shape(names: list[str], score: int) -> None:
    scores = [score if i % 2 == 0 else 0 for i in range(len(names))]
    expect = [{"Host": n, "Score": min(10, max(0, s))} for n, s in zip(names, scores, strict=True)]
    for column in (scores, np.array(scores, np.int64)):  # the gang path's list, the core's array
        raw = host_priority_list(names, column)
        assert json.loads(raw) == expect
        assert raw == json.dumps(expect, separators=(",", ":")).encode()  # the stdlib's bytes


def _json_values(floats: bool) -> st.SearchStrategy[object]:
    scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text()
    if floats:
        scalars = scalars | st.floats(allow_nan=False, allow_infinity=False)
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
        max_leaves=12,
    )


@settings(max_examples=300, deadline=None)
@given(value=_json_values(floats=False))
def test_reply_bytes_are_the_standard_librarys(value: object) -> None:
    """The fast encoder writes what json.dumps wrote: non-ASCII and DEL escaped, big ints exact."""
    assert dumps(value) == json.dumps(value, separators=(",", ":")).encode()


@settings(max_examples=200, deadline=None)
@given(value=_json_values(floats=True))
def test_replies_with_floats_decode_to_the_same_value(value: object) -> None:
    """Floats may be spelled differently (1e-7 for 1e-07), never valued differently."""
    raw = dumps(value)
    assert json.loads(raw) == json.loads(json.dumps(value)) == value


@given(raw=st.binary(max_size=40) | st.text(max_size=20).map(str.encode))
def test_bodies_are_accepted_exactly_when_json_accepts_them(raw: bytes) -> None:
    try:
        expected = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        with pytest.raises((ValueError, UnicodeDecodeError)):
            loads(raw)
        return
    got = loads(raw)
    assert got == expected or (got != got and expected != expected)  # NaN
