"""The extender's preempt verb types. ../shared/wire has no recorded preempt traffic, so the bodies
below are written the way kube-scheduler's Go encoder writes the untagged structs of
k8s.io/kube-scheduler/extender/v1 (PascalCase fields, null for an unset map)."""

from __future__ import annotations

import json

import pytest

from apis.errors import CodecError
from apis.extender import ExtenderPreemptionArgs, ExtenderPreemptionResult, MetaVictims

POD = {"metadata": {"name": "big", "namespace": "ml", "uid": "u-big"}, "spec": {"priority": 1000}}


def test_node_cache_capable_args_round_trip() -> None:
    raw = json.dumps(
        {
            "Pod": POD,
            "NodeNameToVictims": None,
            "NodeNameToMetaVictims": {
                "n2": {"Pods": [{"UID": "u-3"}], "NumPDBViolations": 1},
                "n1": {"Pods": [{"UID": "u-1"}, {"UID": "u-2"}], "NumPDBViolations": 0},
            },
        },
        separators=(",", ":"),
    )
    args = ExtenderPreemptionArgs.from_dict(json.loads(raw))
    assert args.meta and args.pod["metadata"]["uid"] == "u-big"
    assert args.victims == {"n1": MetaVictims(["u-1", "u-2"], 0), "n2": MetaVictims(["u-3"], 1)}
    again = json.loads(args.to_json())
    assert list(again["NodeNameToMetaVictims"]) == ["n1", "n2"]  # a Go map: sorted keys
    assert ExtenderPreemptionArgs.from_dict(again).victims == args.victims


def test_full_pod_victims_become_uids_and_keys_match_case_insensitively() -> None:
    body = {
        "pod": POD,
        "nodenametovictims": {
            "n1": {"pods": [{"metadata": {"name": "a", "uid": "u-a"}}], "numPDBViolations": 2}
        },
    }
    args = ExtenderPreemptionArgs.from_dict(body)
    assert not args.meta and args.victims == {"n1": MetaVictims(["u-a"], 2)}


def test_result_shape() -> None:
    result = ExtenderPreemptionResult({"n1": MetaVictims(["u-1"], 0)})
    assert (
        result.to_json() == '{"NodeNameToMetaVictims":{"n1":{"Pods":[{"UID":"u-1"}],"NumPDBViolations":0}}}'
    )
    assert ExtenderPreemptionResult.from_dict(json.loads(result.to_json())) == result
    assert ExtenderPreemptionResult().to_json() == '{"NodeNameToMetaVictims":{}}'


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"NodeNameToMetaVictims": {}}, "ExtenderPreemptionArgs.Pod"),
        ({"Pod": POD, "NodeNameToMetaVictims": {"n1": {"Pods": [{}]}}}, "UID"),
        ({"Pod": POD, "NodeNameToMetaVictims": {"n1": {"Pods": "x"}}}, "Pods"),
        ({"Pod": POD, "NodeNameToMetaVictims": {"n1": {"NumPDBViolations": -1}}}, "NumPDBViolations"),
    ],
)
def test_bad_args_name_the_field(body: dict, where: str) -> None:
    with pytest.raises(CodecError) as err:
        ExtenderPreemptionArgs.from_dict(body)
    assert where in str(err.value)
