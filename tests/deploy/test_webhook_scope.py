"""Every admission webhook of every variant (deploy/, deploy/extender, deploy/secondary-scheduler)
is sent only the pods its route acts on, and every pod its route acts on: evaluated the way
kube-apiserver selects (namespaceSelector, objectSelector, then each matchCondition, here with
cel-python) over a set of pod shapes, against the route's own decision code. Only pod creations,
never in kube-system or topoalloc-system; the one entry on ResourceClaims likewise, over claim
shapes."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import celpy
import pytest

from allocator.claims.webhook import mark_patch
from allocator.gang.webhook import gate_patch
from allocator.runtime.placement_settings import PlacementSettings
from allocator.runtime.scarce_settings import ScarceAvoidanceSettings
from allocator.scarce.webhook import preference_patch
from topoalloc.commands.installer.kustomize import build

REPO = Path(__file__).resolve().parents[2]
VARIANTS = ("deploy", "deploy/extender", "deploy/secondary-scheduler")
JSON = dict[str, Any]
_ENV = celpy.Environment()
SYSTEM = ("kube-system", "topoalloc-system")


def all_entries(variant: str) -> list[JSON]:
    docs = [d for d in build(REPO / variant) if d]
    configs = [
        d for d in docs if d["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
    ]
    assert configs, variant
    return [hook for c in configs for hook in c["webhooks"]]


def _on(hook: JSON, resource: str) -> bool:
    return any(resource in rule.get("resources", []) for rule in hook["rules"])


def entries(variant: str) -> list[JSON]:
    """The entries on pods."""
    return [
        h
        for h in all_entries(variant)
        if not _on(h, "resourceclaims") and not _on(h, "resourceclaimtemplates")
    ]


def claim_entries(variant: str) -> list[JSON]:
    return [h for h in all_entries(variant) if _on(h, "resourceclaims")]


def template_entries(variant: str) -> list[JSON]:
    return [h for h in all_entries(variant) if _on(h, "resourceclaimtemplates")]


def _selected(selector: JSON | None, labels: dict[str, str]) -> bool:
    for expr in (selector or {}).get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        ok = {
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
            "In": labels.get(key) in values,
            "NotIn": labels.get(key) not in values,
        }[op]
        if not ok:
            return False
    return all(labels.get(k) == v for k, v in ((selector or {}).get("matchLabels") or {}).items())


def sent(hook: JSON, pod: JSON, namespace_labels: dict[str, str] | None = None) -> bool:
    """Whether kube-apiserver calls `hook` for the creation of `pod` (or of any namespaced object)."""
    ns = pod["metadata"].get("namespace", "default")
    if not _selected(
        hook.get("namespaceSelector"), {"kubernetes.io/metadata.name": ns, **(namespace_labels or {})}
    ):
        return False
    if not _selected(hook.get("objectSelector"), pod["metadata"].get("labels") or {}):
        return False
    activation = celpy.json_to_cel({"object": pod})
    for cond in hook.get("matchConditions") or []:
        got = _ENV.program(_ENV.compile(cond["expression"])).evaluate(activation)
        assert not isinstance(got, celpy.CELEvalError), (hook["name"], cond["name"], got)
        if not got:
            return False
    return True


def pod(
    *,
    limits: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "namespace": "team",
            "labels": labels or {},
            "annotations": annotations or {},
        },
        "spec": {
            "containers": [{"name": "c", "image": "x", "resources": {"limits": limits or {"cpu": "1"}}}],
            **spec,
        },
    }


GPU = {"nvidia.com/gpu": "1"}
CLAIMS = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
DAEMONSET_OWNED = {
    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "u"}]
}
SHAPES: dict[str, JSON] = {
    "cpu": pod(),
    "gpu": pod(limits=GPU),
    "gpu-bound": pod(limits=GPU, nodeName="n1"),
    "cpu-bound": pod(nodeName="n1"),
    "gpu-init": {
        **pod(),
        "spec": {
            **pod()["spec"],
            "initContainers": [{"name": "i", "image": "x", "resources": {"limits": GPU}}],
        },
    },
    "rdma": pod(limits={"koordinator.sh/rdma": "1"}),
    "claims": pod(resourceClaims=CLAIMS),
    "claims-bound": pod(resourceClaims=CLAIMS, nodeName="n1"),
    "podgroup": pod(limits=GPU, labels={"scheduling.x-k8s.io/pod-group": "g"}),
    "podgroup-bound": pod(limits=GPU, labels={"scheduling.x-k8s.io/pod-group": "g"}, nodeName="n1"),
    "legacy-podgroup": pod(limits=GPU, labels={"pod-group.scheduling.sigs.k8s.io/name": "g"}),
    "koordinator-label": pod(limits=GPU, labels={"gang.scheduling.koordinator.sh/name": "g"}),
    "koordinator-annotation": pod(limits=GPU, annotations={"gang.scheduling.koordinator.sh/name": "g"}),
    "koordinator-annotation-bound": pod(
        limits=GPU, annotations={"gang.scheduling.koordinator.sh/name": "g"}, nodeName="n1"
    ),
    "native-1.36": pod(limits=GPU, schedulingGroup={"podGroupName": "g"}),
    "native-1.35": pod(limits=GPU, workloadRef={"name": "w", "podGroup": "g"}),
    "placement-opted-out": pod(limits=GPU, labels={"topoalloc.io/placement": "false"}),
    "scarce-opted-out": pod(labels={"topoalloc.io/scarce-avoidance": "false"}),
}
SHAPES["daemonset-cpu"] = copy.deepcopy(SHAPES["cpu"])
SHAPES["daemonset-cpu"]["metadata"].update(DAEMONSET_OWNED)


def _gang(p: JSON) -> bool:
    return gate_patch(p) is not None


def _scarce(p: JSON) -> bool:
    return preference_patch(p, ScarceAvoidanceSettings()) is not None


def _dra(p: JSON) -> bool:
    # the route gates a pod whose claims use topoalloc's classes (read from its cache): every unbound
    # pod naming claims may be one
    return bool(p["spec"].get("resourceClaims")) and not p["spec"].get("nodeName")


def _asks_for_managed(p: JSON) -> bool:
    managed = set(PlacementSettings().resources)
    containers = p["spec"]["containers"] + p["spec"].get("initContainers", [])
    return any(set(c.get("resources", {}).get("limits", {})) & managed for c in containers)


def _placement(p: JSON) -> bool:
    opted_out = (p["metadata"].get("labels") or {}).get("topoalloc.io/placement") == "false"
    return _asks_for_managed(p) and not p["spec"].get("nodeName") and not opted_out


# Each route's own decision: would it change this pod's creation?
ACTS: dict[str, Callable[[JSON], bool]] = {
    "/mutate-pods": _gang,
    "/mutate-pods-dra": _dra,
    "/mutate-pods-scarce": _scarce,
    "/mutate-pods-placement": _placement,
    "/mutate-pods-placement-gate": _placement,
}


def _path(hook: JSON) -> str:
    config = hook["clientConfig"]
    return str(config["service"]["path"]) if "service" in config else str(config["url"])


@pytest.mark.parametrize("variant", VARIANTS)
def test_only_pod_creations_outside_the_system_namespaces(variant: str) -> None:
    for hook in entries(variant):
        assert hook["rules"] == [
            {
                "operations": ["CREATE"],
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": ["pods"],
                "scope": "Namespaced",
            }
        ], hook["name"]
        assert hook.get("objectSelector") or hook.get("matchConditions"), f"{hook['name']} selects every pod"
        assert hook["sideEffects"] in ("None", "NoneOnDryRun") and hook["timeoutSeconds"] <= 5
        for ns in SYSTEM:
            assert not any(
                sent(hook, {**p, "metadata": {**p["metadata"], "namespace": ns}}) for p in SHAPES.values()
            )


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_route_is_sent_exactly_the_pods_it_acts_on(variant: str) -> None:
    hooks = entries(variant)
    routes = {_path(h) for h in hooks}
    assert routes <= set(ACTS), routes - set(ACTS)
    wrong = []
    for route in sorted(routes):
        for shape, p in SHAPES.items():
            called = any(sent(h, p) for h in hooks if _path(h) == route)
            if route == "/mutate-pods-placement-gate":  # only what the leader's route left alone
                called = called and not any(sent(h, p) for h in hooks if _path(h) == "/mutate-pods-placement")
                if called != ACTS[route](p) and not ACTS[route](p):
                    wrong.append(f"{route}: {shape} sent, not acted on")
                continue
            if called != ACTS[route](p):
                wrong.append(f"{route}: {shape} {'sent, not acted on' if called else 'acted on, not sent'}")
    assert not wrong, wrong


@pytest.mark.parametrize("variant", VARIANTS)
def test_opting_out_a_namespace_keeps_its_pods_from_the_optional_routes(variant: str) -> None:
    for hook in entries(variant):
        path = _path(hook)
        if path in ("/mutate-pods-scarce", "/mutate-pods-placement", "/mutate-pods-placement-gate"):
            label = "topoalloc.io/scarce-avoidance" if "scarce" in path else "topoalloc.io/placement"
            assert not any(sent(hook, p, {label: "false"}) for p in SHAPES.values()), hook["name"]


def claim(*requests: JSON, annotations: dict[str, str] | None = None) -> JSON:
    meta = {"name": "c", "namespace": "team", "annotations": annotations or {}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta,
            "spec": {"devices": {"requests": list(requests)}}}  # fmt: skip


def exactly(device_class: str) -> JSON:
    return {
        "name": "r",
        "exactly": {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": 1},
    }


CLAIM_SHAPES: dict[str, JSON] = {
    "topoalloc-gpu": claim(exactly("gpu.topoalloc.io")),
    "topoalloc-pair": claim(exactly("nvlink-pair.topoalloc.io")),
    "other-driver": claim(exactly("gpu.nvidia.com")),
    "mixed": claim(exactly("gpu.topoalloc.io"), {**exactly("gpu.nvidia.com"), "name": "s"}),
    "no-requests": claim(),
    "opted-out": claim(exactly("gpu.topoalloc.io"), annotations={"topoalloc.io/allocator": "kube-scheduler"}),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_claims_entry_is_sent_only_claim_creations_it_may_mark(variant: str) -> None:
    """Only ResourceClaim creations, never in the system namespaces; every claim the route marks is
    sent (a claim sent that it leaves alone costs a call, not a wrong answer: the route reads the
    cache-free parts only, so the condition narrows by DeviceClass and the route decides the rest)."""
    assert any(mark_patch(c) is not None for c in CLAIM_SHAPES.values())
    for hook in claim_entries(variant):
        assert [r["resources"] for r in hook["rules"]] == [["resourceclaims"]], hook["name"]
        assert [r["operations"] for r in hook["rules"]] == [["CREATE"]], hook["name"]
        assert hook.get("matchConditions") and hook["sideEffects"] == "None" and hook["timeoutSeconds"] <= 5
        for shape, c in CLAIM_SHAPES.items():
            for ns in SYSTEM:
                assert not sent(hook, {**c, "metadata": {**c["metadata"], "namespace": ns}}), (shape, ns)
            if mark_patch(c) is not None:
                assert sent(hook, c), f"{shape} is marked by the route but not sent"
        assert not sent(hook, CLAIM_SHAPES["other-driver"]) and not sent(hook, CLAIM_SHAPES["no-requests"])


def template(*requests: JSON) -> JSON:
    meta = {"name": "t", "namespace": "team"}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": meta,
            "spec": {"spec": {"devices": {"requests": list(requests)}}}}  # fmt: skip


def share(device_class: str) -> JSON:
    r = exactly(device_class)
    return {**r, "exactly": {**r["exactly"], "capacity": {"requests": {"cores": "30", "memory": "10Gi"}}}}


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_templates_entry_is_sent_only_template_creations_asking_a_gpu_share(variant: str) -> None:
    """The route refuses a template only for a share of topoalloc's GPUs (where no node publishes a
    sharable GPU): those are sent, whole-device templates and other drivers' are not."""
    hooks = template_entries(variant)
    assert hooks, "no entry for ResourceClaimTemplates"
    asks = template(share("gpu.topoalloc.io"))
    for hook in hooks:
        assert [r["resources"] for r in hook["rules"]] == [["resourceclaimtemplates"]], hook["name"]
        assert [r["operations"] for r in hook["rules"]] == [["CREATE"]], hook["name"]
        assert hook["sideEffects"] == "None" and hook["timeoutSeconds"] <= 5
        assert hook["failurePolicy"] == "Ignore"  # a refusal guard: never blocks templates when down
        assert sent(hook, asks)
        for ns in SYSTEM:
            assert not sent(hook, {**asks, "metadata": {**asks["metadata"], "namespace": ns}}), ns
        assert not sent(hook, template(exactly("gpu.topoalloc.io")))  # whole GPUs
        assert not sent(hook, template(share("gpu.nvidia.com")))  # another driver's share
        assert not sent(hook, template())
