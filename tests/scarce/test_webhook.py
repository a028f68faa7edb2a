"""Scarce-resource avoidance's admission route: which pods get the preferred node affinity away
from GPU nodes, what the patch does to a pod's own affinity, and that no pod makes it fail."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.runtime.config import ServiceConfig
from allocator.runtime.scarce_settings import DEFAULT_NODE_LABELS, ScarceAvoidanceSettings
from allocator.scarce.webhook import PATH, PREFERRED, preference_patch, preferred_term, reviewer, routes
from apis import keys

ON = ScarceAvoidanceSettings()
TERM = {
    "weight": 50,
    "preference": {"matchExpressions": [{"key": k, "operator": "DoesNotExist"} for k in DEFAULT_NODE_LABELS]},
}


def pod(requests: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    resources = {"requests": dict(requests or {"cpu": "2", "memory": "4Gi"})}
    return {
        "metadata": {"name": "p", "namespace": "default", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "nginx", "resources": resources}], **spec},
    }


def mutated(p: dict[str, Any], cfg: ScarceAvoidanceSettings = ON) -> dict[str, Any]:
    """The pod as the API server stores it after applying our patch (unchanged without one)."""
    ops = preference_patch(p, cfg)
    return jsonpatch.apply_patch(p, ops) if ops else p


def preferred(p: dict[str, Any]) -> list[Any]:
    return ((p["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get(PREFERRED) or []


def test_a_cpu_only_pod_prefers_nodes_without_gpus() -> None:
    out = mutated(pod())
    assert preferred(out) == [TERM]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in out["spec"]["affinity"]["nodeAffinity"]


@pytest.mark.parametrize(
    "requests",
    [
        {"cpu": "1"},
        {},
        {"memory": "1Gi", "ephemeral-storage": "10Gi", "hugepages-2Mi": "64Mi"},
        {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "1Gi"},  # Koordinator tiers
    ],
    ids=["cpu", "nothing", "storage-hugepages", "koordinator-batch"],
)
def test_plain_resources_count_as_cpu_only(requests: dict[str, str]) -> None:
    p = pod()
    p["spec"]["containers"][0]["resources"] = {"requests": requests, "limits": requests}
    assert preferred(mutated(p)) == [TERM]


@pytest.mark.parametrize(
    "requests",
    [
        {"nvidia.com/gpu": "1"},
        {"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"},
        {"koordinator.sh/rdma": "100"},
        {"huawei.com/npu-core": "1"},
        {"example.com/fpga": "1"},  # any device plugin's resource, ours or not
        {"nvidia.com/mig-1g.10gb": "1"},
    ],
)
def test_device_pods_are_left_alone(requests: dict[str, str]) -> None:
    assert preference_patch(pod({"cpu": "1", **requests}), ON) is None


def test_a_device_in_limits_only_or_an_init_container_or_a_claim_counts() -> None:
    limits = pod()
    limits["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "1"}
    init = pod(initContainers=[{"name": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}}])
    claim = pod(resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}])
    for p in (limits, init, claim):
        assert preference_patch(p, ON) is None


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(
            lambda p: p["metadata"]["labels"].update({keys.SCARCE_AVOIDANCE: "false"}), id="opted-out"
        ),
        pytest.param(lambda p: p["spec"].update(nodeName="n1"), id="bound-at-creation"),
        pytest.param(lambda p: p["spec"].update(schedulerName="volcano"), id="another-scheduler"),
        pytest.param(
            lambda p: p["metadata"].update(ownerReferences=[{"kind": "DaemonSet", "name": "ds"}]),
            id="daemonset",
        ),
    ],
)
def test_pods_left_alone(change: Any) -> None:
    p = pod()
    change(p)
    cfg = ScarceAvoidanceSettings(scheduler_names=["default-scheduler", "topoalloc-scheduler"])
    assert preference_patch(p, cfg) is None


def test_other_label_values_and_schedulers_served_are_not_an_opt_out() -> None:
    p = pod()
    p["metadata"]["labels"][keys.SCARCE_AVOIDANCE] = "true"
    p["spec"]["schedulerName"] = "topoalloc-scheduler"
    cfg = ScarceAvoidanceSettings(scheduler_names=["topoalloc-scheduler"])
    assert preference_patch(p, cfg) is not None
    rs_pod = pod()
    rs_pod["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "name": "web-1"}]
    assert preference_patch(rs_pod, ON) is not None


def test_the_pods_own_affinity_is_kept_and_the_term_added_beside_it() -> None:
    zone = {
        "weight": 80,
        "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
    }
    required = {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["x"]}]}]
    }
    anti = {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "kubernetes.io/hostname"}]}
    cases = [
        {"podAntiAffinity": anti},
        {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}},
        {"nodeAffinity": {PREFERRED: [zone]}},
    ]
    for affinity in cases:
        out = mutated(pod(affinity=copy.deepcopy(affinity)))
        node = out["spec"]["affinity"]["nodeAffinity"]
        assert node[PREFERRED] == [*(affinity.get("nodeAffinity", {}).get(PREFERRED) or []), TERM]
        assert out["spec"]["affinity"].get("podAntiAffinity") == affinity.get("podAntiAffinity")
        assert node.get("requiredDuringSchedulingIgnoredDuringExecution") == (
            affinity.get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution")
        )


def test_a_reinvocation_adds_nothing() -> None:
    once = mutated(pod())
    assert preference_patch(once, ON) is None


def test_weight_and_labels_are_configured() -> None:
    cfg = ServiceConfig.from_mapping(
        {
            "scarceAvoidance": {
                "weight": 7,
                "nodeLabels": ["accelerator"],
                "schedulerNames": ["default-scheduler"],
            }
        }
    ).scarce_avoidance
    assert preferred(mutated(pod(), cfg)) == [
        {
            "weight": 7,
            "preference": {"matchExpressions": [{"key": "accelerator", "operator": "DoesNotExist"}]},
        }
    ]
    assert preferred_term(cfg) == preferred(mutated(pod(), cfg))[0]


@pytest.mark.parametrize(
    ("block", "says"),
    [
        ({"weight": 0}, "1 to 100"),
        ({"weight": 101}, "1 to 100"),
        ({"nodeLabels": []}, "at least one label"),
        ({"weight": "high"}, "expected an integer"),
        ({"nodeLabel": ["x"]}, "unknown setting"),
    ],
)
def test_bad_settings_are_refused(block: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        ServiceConfig.from_mapping({"scarceAvoidance": block})


def test_turned_off_the_route_is_not_served() -> None:
    assert routes(ScarceAvoidanceSettings(enabled=False, node_labels=[])) == {}
    assert list(routes(ON)) == [PATH]


def _review(obj: Any, operation: str = "CREATE") -> dict[str, Any]:
    request = {"uid": "u", "kind": {"kind": "Pod"}, "operation": operation, "object": obj}
    return reviewer(ON)(request)


def test_only_pod_creations_are_mutated() -> None:
    assert "patch" in _review(pod())
    assert _review(pod(), "UPDATE") == {"uid": "u", "allowed": True}


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)
FIELDS = st.sampled_from(
    ["affinity", "containers", "initContainers", "resources", "resourceClaims", "nodeName"]
)


@settings(max_examples=300, deadline=None)
@given(spec=st.dictionaries(FIELDS, JSONISH, max_size=4), meta=st.dictionaries(st.text(max_size=8), JSONISH))
def test_any_object_is_allowed_and_a_patch_always_applies(spec: dict[str, Any], meta: dict[str, Any]) -> None:
    obj = {"metadata": meta, "spec": spec}
    response = _review(obj)
    assert response["allowed"] is True
    ops = preference_patch(obj, ON)
    if ops:
        out = jsonpatch.apply_patch(obj, ops)
        assert preferred(out)[-1] == TERM
