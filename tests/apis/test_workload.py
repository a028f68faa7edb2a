"""Kubernetes' own gang API at the boundary (apis/workload.py, apis/gang_object.py): the shapes the
v1.36.3 and v1.35.6 API servers serve, how a pod names its gang, the one gang model over the three
sources, and malformed input refused with the field's path."""

from __future__ import annotations

from typing import Any

import pytest

from apis import keys
from apis import podgroup as pg
from apis.errors import CodecError
from apis.gang_object import gang_object, native_conditions, status_of_native
from apis.workload import NativePodGroup, SchedulingPolicy, WorkloadV1Alpha1, membership

# As the v1.36.3 server returns one made from a Workload's template (kube-scheduler's condition set).
PODGROUP_1_36: dict[str, Any] = {
    "apiVersion": "scheduling.k8s.io/v1alpha2",
    "kind": "PodGroup",
    "metadata": {"name": "pg1", "namespace": "ml", "uid": "u-pg1", "finalizers": ["scheduling.k8s.io/podgroup-protection"]},
    "spec": {
        "podGroupTemplateRef": {"workload": {"workloadName": "w1", "podGroupTemplateName": "workers"}},
        "schedulingPolicy": {"gang": {"minCount": 4}},
        "disruptionMode": "Pod",
    },
    "status": {
        "conditions": [
            {"type": "PodGroupScheduled", "status": "False", "reason": "Unschedulable", "message": "x",
             "lastTransitionTime": "2026-11-27T22:13:19Z"},
            {"type": "topoalloc.io/TimedOut", "status": "True", "reason": "ScheduleTimeout", "message": "y",
             "lastTransitionTime": "2026-11-27T22:13:19Z"},
        ]
    },
}  # fmt: skip
WORKLOAD_1_35: dict[str, Any] = {
    "apiVersion": "scheduling.k8s.io/v1alpha1",
    "kind": "Workload",
    "metadata": {"name": "train", "namespace": "ml", "uid": "u-w"},
    "spec": {
        "controllerRef": {"apiGroup": "batch", "kind": "Job", "name": "train"},
        "podGroups": [
            {"name": "workers", "policy": {"gang": {"minCount": 8}}},
            {"name": "ps", "policy": {"basic": {}}},
        ],
    },
}


def pod(spec: dict[str, Any] | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ml", "labels": labels or {}}, "spec": spec or {}}


def test_a_1_36_podgroup_reads_as_the_server_serves_it() -> None:
    group = NativePodGroup.from_dict(PODGROUP_1_36)
    assert group.name == "pg1" and group.policy == SchedulingPolicy(4) and group.policy.gang
    assert group.template == ("w1", "workers")
    assert [c["type"] for c in group.conditions] == ["PodGroupScheduled", "topoalloc.io/TimedOut"]
    basic = NativePodGroup.from_dict({**PODGROUP_1_36, "spec": {"schedulingPolicy": {"basic": {}}}})
    assert not basic.policy.gang and basic.policy.min_count is None


def test_a_1_35_workload_reads_its_pod_groups() -> None:
    workload = WorkloadV1Alpha1.from_dict(WORKLOAD_1_35)
    assert workload.pod_groups == {"workers": SchedulingPolicy(8), "ps": SchedulingPolicy(None)}


@pytest.mark.parametrize(
    ("spec", "field", "says"),
    [
        ({}, "spec.schedulingPolicy", "is required"),
        ({"schedulingPolicy": {}}, "spec.schedulingPolicy", "exactly one of basic, gang"),
        ({"schedulingPolicy": {"basic": {}, "gang": {"minCount": 2}}}, "spec.schedulingPolicy", "exactly one"),
        ({"schedulingPolicy": {"gang": {}}}, "spec.schedulingPolicy.gang.minCount", "is required"),
        ({"schedulingPolicy": {"gang": {"minCount": 0}}}, "spec.schedulingPolicy.gang.minCount", "between 1"),
        ({"schedulingPolicy": {"gang": {"minCount": "two"}}}, "spec.schedulingPolicy.gang.minCount", "integer"),
        ({"schedulingPolicy": {"gang": []}}, "spec.schedulingPolicy.gang", "expected an object"),
        ({"schedulingPolicy": {"gang": {"minCount": 2}}, "podGroupTemplateRef": {"workload": {}}},
         "spec.podGroupTemplateRef.workload.workloadName", "is required"),
    ],
)  # fmt: skip
def test_a_malformed_podgroup_names_the_field(spec: dict[str, Any], field: str, says: str) -> None:
    with pytest.raises(CodecError) as err:
        NativePodGroup.from_dict({**PODGROUP_1_36, "spec": spec, "status": {}})
    assert err.value.field == field and says in err.value.problem, str(err.value)


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        ({**PODGROUP_1_36, "apiVersion": "scheduling.k8s.io/v1alpha1"}, "apiVersion"),
        ({**PODGROUP_1_36, "status": {"conditions": "none"}}, "status.conditions"),
        ({**PODGROUP_1_36, "status": {"conditions": ["Ready"]}}, "status.conditions[0]"),
        ({k: v for k, v in PODGROUP_1_36.items() if k != "spec"}, "spec"),
    ],
)
def test_other_malformed_podgroups(obj: dict[str, Any], field: str) -> None:
    with pytest.raises(CodecError) as err:
        NativePodGroup.from_dict(obj)
    assert err.value.field == field, str(err.value)


def test_a_malformed_workload_names_the_field() -> None:
    twice = {"podGroups": [{"name": "w", "policy": {"basic": {}}}, {"name": "w", "policy": {"basic": {}}}]}
    for spec, field in (
        (twice, "spec.podGroups[1].name"),
        ({"podGroups": [{"policy": {"basic": {}}}]}, "spec.podGroups[0].name"),
        ({"podGroups": [{"name": "w"}]}, "spec.podGroups[0].policy"),
        ({"podGroups": {"w": {}}}, "spec.podGroups"),
    ):
        with pytest.raises(CodecError) as err:
            WorkloadV1Alpha1.from_dict({**WORKLOAD_1_35, "spec": spec})
        assert err.value.field == field, str(err.value)


def test_how_a_pod_names_a_native_gang() -> None:
    ref = pg.gang_of(pod({"schedulingGroup": {"podGroupName": "pg1"}}))
    assert ref == pg.GangRef("ml", "pg1", pg.NATIVE_SOURCE) and ref.native and ref.object_key == "ml/pg1"
    ref = pg.gang_of(
        pod({"workloadRef": {"name": "train", "podGroup": "workers", "podGroupReplicaKey": "r1"}})
    )
    assert ref is not None and ref.key == "ml/train/workers/r1" and ref.source == pg.WORKLOAD_SOURCE
    assert (ref.workload, ref.pod_group, ref.object_key) == ("train", "workers", "ml/train")
    # kube-scheduler reads the native field first, whatever labels the pod also carries.
    both = pod({"schedulingGroup": {"podGroupName": "pg1"}}, {keys.POD_GROUP_LABEL: "other"})
    assert pg.gang_of(both) == pg.GangRef("ml", "pg1", pg.NATIVE_SOURCE)
    assert not pg.GangRef("ml", "x", pg.PODGROUP_SOURCE).native
    assert membership(pod()) is None and membership({"spec": "x"}) is None


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"schedulingGroup": "pg1"}, "spec.schedulingGroup"),
        ({"schedulingGroup": {}}, "spec.schedulingGroup.podGroupName"),
        ({"schedulingGroup": {"podGroupName": 7}}, "spec.schedulingGroup.podGroupName"),
        ({"workloadRef": {"name": "train"}}, "spec.workloadRef.podGroup"),
        ({"workloadRef": {"podGroup": "w"}}, "spec.workloadRef.name"),
    ],
)
def test_a_malformed_membership_names_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(CodecError) as err:
        pg.gang_of(pod(spec))
    assert err.value.field == field, str(err.value)


def test_one_gang_model_over_the_three_sources() -> None:
    native = gang_object(pg.GangRef("ml", "pg1", pg.NATIVE_SOURCE), PODGROUP_1_36)
    assert (native.kind, native.api_version, native.name, native.uid) == (
        "PodGroup", "scheduling.k8s.io/v1alpha2", "pg1", "u-pg1",
    )  # fmt: skip
    assert native.min_member == 4 and native.has_status and not native.records_start
    assert native.status.phase == "Failed"  # topoalloc's TimedOut condition, read back
    ref = pg.GangRef("ml", "train/workers", pg.WORKLOAD_SOURCE, workload="train", pod_group="workers")
    workers = gang_object(ref, WORKLOAD_1_35)
    assert (workers.kind, workers.name, workers.min_member, workers.has_status) == (
        "Workload",
        "train",
        8,
        False,
    )
    ps = gang_object(
        pg.GangRef("ml", "train/ps", pg.WORKLOAD_SOURCE, workload="train", pod_group="ps"), WORKLOAD_1_35
    )
    assert ps.min_member == 1 and not ps.gang  # basic: each member on its own
    sp = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": "g", "uid": "u"},
          "spec": {"minMember": 3, "scheduleTimeoutSeconds": 60}}  # fmt: skip
    plugins = gang_object(pg.GangRef("ml", "g", pg.PODGROUP_SOURCE), sp)
    assert (plugins.min_member, plugins.timeout, plugins.records_start, plugins.namespace) == (
        3,
        60,
        True,
        "ml",
    )
    with pytest.raises(CodecError, match="has no pod group 'eval' \\(it has ps, workers\\)"):
        gang_object(
            pg.GangRef("ml", "train/eval", pg.WORKLOAD_SOURCE, workload="train", pod_group="eval"),
            WORKLOAD_1_35,
        )


def test_topoalloc_conditions_on_a_native_podgroup_round_trip() -> None:
    status = {
        "phase": "PreScheduling",
        "scheduled": 0,
        "conditions": [
            {"type": "Waiting", "status": "True", "reason": "InsufficientTopology", "message": "m"},
            {"type": "TimedOut", "status": "False", "reason": "WithinTimeout", "message": ""},
        ],
    }
    written = native_conditions(status)
    assert [c["type"] for c in written] == ["topoalloc.io/Waiting", "topoalloc.io/TimedOut"]
    theirs = {"type": "PodGroupScheduled", "status": "False", "reason": "Unschedulable"}
    back = status_of_native([theirs, *written])
    assert back.conditions == status["conditions"] and back.phase == ""  # kube-scheduler's left out
