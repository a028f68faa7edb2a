"""The Reservation CR and the pod side of the protocol: decoding, owners, what the CRD accepts."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from apis import keys
from apis.errors import CodecError
from apis.reservation import Reservation
from apis.reservation_pod import (
    ExactMatch,
    ReservationAllocated,
    parse_exact_match,
    parse_reservation_affinity,
    parse_reservation_allocated,
)
from tests.apis.test_crds import _validate

# What a Koordinator user writes (their docs' shape): a template with device resources, owners by
# controller and by label, a TTL, Restricted.
KOORDINATOR_STYLE: dict[str, Any] = {
    "apiVersion": "scheduling.koordinator.sh/v1alpha1",
    "kind": "Reservation",
    "metadata": {"name": "train-0900", "creationTimestamp": "2030-01-02T08:00:00Z", "uid": "u-1"},
    "spec": {
        "template": {
            "metadata": {"namespace": "ml", "labels": {"team": "a"}},
            "spec": {
                "containers": [
                    {
                        "name": "stub",
                        "image": "busybox",
                        "resources": {
                            "requests": {"nvidia.com/gpu": "2", "cpu": "8", "memory": "64Gi", "pods": "2"}
                        },
                    }
                ],
                "schedulerName": "default-scheduler",
            },
        },
        "owners": [
            {"controller": {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "namespace": "ml"}},
            {"labelSelector": {"matchLabels": {"app": "train"}}},
        ],
        "ttl": "1h30m",
        "allocateOnce": False,
        "allocatePolicy": "Restricted",
        "taints": [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}],
    },
}


def test_a_koordinator_users_reservation_decodes_and_validates() -> None:
    _validate("Reservation", KOORDINATOR_STYLE)
    res = Reservation.from_dict(KOORDINATOR_STYLE)
    assert (res.name, res.uid, res.ttl, res.allocate_once, res.restricted) == (
        "train-0900",
        "u-1",
        5400.0,
        False,
        True,
    )
    assert res.expiry() == res.created + 5400 and res.pod_limit() == 2
    assert res.taints == ({"key": "dedicated", "value": "ml", "effect": "NoSchedule"},)
    job_pod = {
        "namespace": "ml",
        "name": "train-abc",
        "ownerReferences": [{"kind": "Job", "name": "train", "apiVersion": "batch/v1"}],
    }
    assert any(o.matches(job_pod) for o in res.owners)
    assert not any(o.matches({**job_pod, "namespace": "other"}) for o in res.owners)
    assert any(o.matches({"namespace": "x", "labels": {"app": "train"}}) for o in res.owners)
    pod = res.template_pod()
    assert pod["metadata"]["namespace"] == "ml" and pod["metadata"]["labels"] == {"team": "a"}
    assert "pods" not in pod["spec"]["containers"][0]["resources"]["requests"]  # a count, not a resource


def test_defaults_expiry_and_the_reserved_devices() -> None:
    body = json.loads(json.dumps(KOORDINATOR_STYLE))
    del body["spec"]["ttl"]
    body["metadata"]["annotations"] = {
        keys.DEVICE_ALLOCATED: '{"gpu":[{"minor":3,"resources":{"koordinator.sh/gpu-core":"100"}}]}'
    }
    res = Reservation.from_dict(body)
    assert res.ttl == 24 * 3600 and res.reserved is not None and res.reserved.minors("gpu") == [3]
    assert keys.DEVICE_ALLOCATED not in res.template_pod()["metadata"]["annotations"]
    body["spec"]["expires"] = "2030-01-02T09:00:00Z"
    assert Reservation.from_dict(body).expiry() == res.created + 3600  # expires before ttl
    body["spec"]["ttl"] = "0"
    del body["spec"]["expires"]
    assert Reservation.from_dict(body).expiry() == float("inf")


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("spec", "ttl"), "soon", "spec.ttl"),
        (("spec", "expires"), "tomorrow", "spec.expires"),
        (("spec", "allocatePolicy"), "Loose", "spec.allocatePolicy"),
        (("spec", "owners"), [], "spec.owners"),
        (
            ("spec", "owners"),
            [{"labelSelector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}}],
            "operator",
        ),
        (("spec", "taints"), [{"key": "k", "effect": "Sometimes"}], "effect"),
        (("metadata", "annotations"), {keys.DEVICE_ALLOCATED: "{not json"}, keys.DEVICE_ALLOCATED),
    ],
)
def test_bad_fields_are_named(path: tuple[str, str], value: Any, field: str) -> None:
    body = json.loads(json.dumps(KOORDINATOR_STYLE))
    body[path[0]][path[1]] = value
    with pytest.raises(CodecError, match=field.replace(".", r"\.")):
        Reservation.from_dict(body)


def test_the_crd_refuses_what_it_can_and_prunes_nothing_we_write() -> None:
    body = json.loads(json.dumps(KOORDINATOR_STYLE))
    body["spec"]["allocatePolicy"] = "Loose"
    with pytest.raises(jsonschema.ValidationError):
        _validate("Reservation", body)
    status = {
        "phase": "Available",
        "nodeName": "n",
        "allocatable": {"nvidia.com/gpu": "2", "pods": "2"},
        "allocated": {"pods": "1"},
        "currentOwners": [{"namespace": "ml", "name": "p", "uid": "u"}],
        "conditions": [
            {
                "type": "Scheduled",
                "status": "True",
                "reason": "Scheduled",
                "lastProbeTime": "2030-01-02T08:00:00Z",
                "lastTransitionTime": "2030-01-02T08:00:00Z",
            }
        ],
    }
    _validate("Reservation", {**KOORDINATOR_STYLE, "status": status})


def test_pod_annotations() -> None:
    assert ReservationAllocated("r", "u").to_json() == '{"name":"r","uid":"u"}'
    assert parse_reservation_allocated('{"name":"r"}') == ReservationAllocated("r")
    affinity = parse_reservation_affinity(
        json.dumps({
            "name": "r",
            "reservationSelector": {"team": "a"},
            "requiredDuringSchedulingIgnoredDuringExecution": {"reservationSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]},
            "tolerations": [{"key": "dedicated", "operator": "Exists"}],
        })
    )  # fmt: skip
    assert affinity.name == "r" and affinity.selector == {"team": "a"} and affinity.terms is not None
    assert affinity.tolerates_all(({"key": "dedicated", "value": "ml", "effect": "NoSchedule"},)) is None
    assert affinity.tolerates_all(({"key": "other", "effect": "NoExecute"},)) == {
        "key": "other",
        "effect": "NoExecute",
    }
    with pytest.raises(CodecError, match="operator"):
        parse_reservation_affinity('{"tolerations":[{"key":"a","operator":"Maybe"}]}')


def test_exact_match_checks_every_name() -> None:
    spec = parse_exact_match('{"resourceNames":["cpu","nvidia.com/gpu"]}')
    assert spec == ExactMatch(("cpu", "nvidia.com/gpu"))
    assert spec.matches({"nvidia.com/gpu": 2}, {"nvidia.com/gpu": 2})  # cpu absent on both sides
    # Koordinator stops at the first name absent on both sides and says "match" (⚠); every name counts here.
    assert not spec.matches({"nvidia.com/gpu": 1}, {"nvidia.com/gpu": 2})
    assert not spec.matches({"cpu": 1}, {})
