"""Bad request bodies get a 400 with a message, never a 500, and change nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.allocator_harness import pod, running_allocator, seed_nodes
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Pki

CASES: list[tuple[str, Any, str]] = [
    ("filter", b"", "empty request body"),
    ("filter", b"this is not json", "not JSON"),
    ("filter", b"\xff\xfe", "not JSON"),
    ("filter", [], "expected an object"),
    ("filter", {"Nodes": None, "NodeNames": ["a"]}, "Pod: is required"),
    ("filter", {"Pod": {"metadata": {}}, "NodeNames": ["a"]}, "name"),
    ("filter", {"Pod": {"metadata": {"name": "p"}}, "NodeNames": "node-1"}, "NodeNames"),
    ("filter", {"Pod": {"metadata": {"name": "p"}}, "NodeNames": [1, 2]}, "NodeNames"),
    ("filter", {"Pod": {"metadata": {"name": "p"}}, "Nodes": {"items": [{"metadata": {}}]}}, "name"),
    ("filter", {"Pod": {"metadata": {"name": "p"}}, "Nodes": {"items": "x"}}, "items"),
    ("prioritize", {"Pod": "p"}, "Pod"),
    ("prioritize", {"Pod": {"metadata": {"name": 7}}, "NodeNames": []}, "name"),
    ("bind", {"PodName": "p", "PodNamespace": "default"}, "Node: is required"),
    ("bind", {"PodName": 1, "PodNamespace": "default", "Node": "n"}, "PodName"),
    ("bind", {"podname": "p", "podnamespace": None, "node": "n"}, "PodNamespace"),
    (
        "bind",
        {"PodName": "0", "PodNamespace": "", "PodUID": "u", "Node": "n"},
        "PodNamespace: must not be empty",
    ),
    ("bind", {"PodName": "p", "PodNamespace": "default", "Node": ""}, "Node: must not be empty"),
]


@pytest.fixture
async def run(fake_api: FakeApiServer, pki: Pki):  # type: ignore[no-untyped-def]
    seed_nodes(fake_api, ["node-1"])
    async with running_allocator(fake_api, pki) as running:
        yield running


async def test_each_malformed_body_gets_a_400_with_its_reason(run) -> None:  # type: ignore[no-untyped-def]
    for verb, body, reason in CASES:
        status, text = await run.client.post(verb, body)
        assert status == 400, (verb, body, text)
        assert reason in text, (verb, body, text)
    failures = run.metric("topoalloc_extender_failures_total", {"verb": "filter", "reason": "bad_request"})
    assert failures == sum(1 for v, _, _ in CASES if v == "filter")


async def test_go_style_keys_are_accepted(run, fake_api: FakeApiServer) -> None:  # type: ignore[no-untyped-def]
    # Go's decoder matches keys case-insensitively (wire fact 1); kube-scheduler itself sends PascalCase.
    p = fake_api.put(pod("w", gpus=1))
    status, body = await run.client.post("filter", {"pod": p, "nodenames": ["node-1"]})
    assert status == 200 and body["NodeNames"] == ["node-1"]
    status, body = await run.client.post(
        "bind", {"podName": "w", "podNamespace": "default", "podUID": p["metadata"]["uid"], "node": "node-1"}
    )
    assert status == 200 and body == {"Error": ""}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)
keys = st.sampled_from(["Pod", "Nodes", "NodeNames", "PodName", "PodNamespace", "PodUID", "Node", "metadata",
                        "items", "name", "spec", "containers", "resources", "annotations"])  # fmt: skip
shaped = st.recursive(
    json_values,
    lambda children: st.dictionaries(keys, children, max_size=5) | st.lists(children, max_size=3),
    max_leaves=20,
)


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(verb=st.sampled_from(["filter", "prioritize", "bind"]), body=shaped)
async def test_no_body_gives_a_500(run, verb: str, body: Any) -> None:  # type: ignore[no-untyped-def]
    status, text = await run.client.post(verb, json.dumps(body))
    assert status in (200, 400), text
