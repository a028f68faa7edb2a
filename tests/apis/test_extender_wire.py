"""Every recorded kube-scheduler extender body round-trips through apis.extender."""

from __future__ import annotations

import json

import pytest

from apis.errors import CodecError
from apis.extender import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    host_priority_list_json,
    parse_host_priority_list,
)
from tests.apis.paths import EXTENDER_WIRE, require_shared

require_shared()

REQUESTS = sorted(EXTENDER_WIRE.glob("filter-*.request.json")) + sorted(
    EXTENDER_WIRE.glob("prioritize-*.request.json")
)
BINDS = sorted(EXTENDER_WIRE.glob("bind-*.request.json"))
FILTER_REPLIES = sorted(EXTENDER_WIRE.glob("filter-*.response.json"))
PRIORITIZE_REPLIES = sorted(EXTENDER_WIRE.glob("prioritize-*.response.json"))
BIND_REPLIES = sorted(EXTENDER_WIRE.glob("bind-*.response.json"))


def _json_or_none(path):
    try:
        return json.loads(path.read_bytes())
    except ValueError:
        return None  # deliberately broken replies (garbage, HTTP 500 text) recorded for error scenarios


def test_recordings_are_present() -> None:
    assert len(REQUESTS) > 50 and len(BINDS) > 20


@pytest.mark.parametrize("path", REQUESTS, ids=lambda p: p.name)
def test_extender_args_round_trip_byte_identical(path) -> None:
    raw = path.read_bytes().decode()
    args = ExtenderArgs.from_dict(json.loads(raw))
    assert args.to_json() == raw
    assert args.names()  # both modes yield the candidate names
    assert (args.nodes is None) != (args.node_names is None)


@pytest.mark.parametrize("path", BINDS, ids=lambda p: p.name)
def test_binding_args_round_trip_byte_identical(path) -> None:
    raw = path.read_bytes().decode()
    assert ExtenderBindingArgs.from_dict(json.loads(raw)).to_json() == raw


@pytest.mark.parametrize("path", FILTER_REPLIES, ids=lambda p: p.name)
def test_filter_replies_decode_like_go(path) -> None:
    data = _json_or_none(path)
    if data is None:
        pytest.skip("recorded reply is not JSON by design")
    result = ExtenderFilterResult.from_dict(data)
    again = json.loads(result.to_json())
    # Same content under Go's canonical field names, whatever casing the recording used.
    lowered = {k.lower(): v for k, v in data.items()}
    for field in ExtenderFilterResult.FIELDS:
        if field.lower() in lowered:
            expected = lowered[field.lower()]
            if field in ("FailedNodes", "FailedAndUnresolvableNodes") and expected is None:
                expected = {}
            assert again[field] == expected


@pytest.mark.parametrize("path", PRIORITIZE_REPLIES, ids=lambda p: p.name)
def test_prioritize_replies_round_trip(path) -> None:
    data = _json_or_none(path)
    if data is None:
        pytest.skip("recorded reply is not JSON by design")
    items = parse_host_priority_list(data)
    assert [(h.host, h.score) for h in items] == [
        ({k.lower(): v for k, v in d.items()}["host"], {k.lower(): v for k, v in d.items()}["score"])
        for d in data
    ]
    assert json.loads(host_priority_list_json(items)) == [{"Host": h.host, "Score": h.score} for h in items]


@pytest.mark.parametrize("path", BIND_REPLIES, ids=lambda p: p.name)
def test_bind_replies_decode(path) -> None:
    data = _json_or_none(path)
    if data is None:
        pytest.skip("recorded reply is not JSON by design")
    result = ExtenderBindingResult.from_dict(data)
    assert result.error == {k.lower(): v for k, v in data.items()}.get("error", "")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"Nodes": None, "NodeNames": ["a"]}, "ExtenderArgs.Pod"),
        ({"Pod": [], "NodeNames": ["a"]}, "ExtenderArgs.Pod"),
        ({"Pod": {"metadata": {}}, "NodeNames": ["a"]}, "ExtenderArgs.Pod.metadata.name"),
        ({"Pod": {"metadata": {"name": "p"}}, "NodeNames": "a"}, "ExtenderArgs.NodeNames"),
        (
            {"Pod": {"metadata": {"name": "p"}}, "Nodes": {"items": [{}]}},
            "ExtenderArgs.Nodes.items[0].metadata.name",
        ),
    ],
)
def test_malformed_extender_args(body: dict, field: str) -> None:
    with pytest.raises(CodecError) as exc:
        ExtenderArgs.from_dict(body)
    assert exc.value.field == field


def test_malformed_binding_args() -> None:
    with pytest.raises(CodecError, match="PodName"):
        ExtenderBindingArgs.from_dict({"PodNamespace": "default", "Node": "n"})
    with pytest.raises(CodecError, match="expected a string"):
        ExtenderBindingArgs.from_dict({"PodName": 1, "PodNamespace": "default", "Node": "n"})
