"""Pod rules: create-time defaults, what an update may change, graceful deletion and binding.

Defaults are the ones the recorded v1.32 apiserver applied (see ../shared/wire/apiserver/pod-create*), so a
pod read back from the fake looks like one read from a cluster. Admission plugins that need other objects
(ServiceAccount, LimitRange, PriorityClass lookups) are not emulated beyond their visible defaults.
"""

from __future__ import annotations

import copy
import re
from decimal import Decimal, InvalidOperation
from typing import Any

from .behaviour import KindBehaviour
from .errors import FieldError
from .objects import reorder

JsonObj = dict[str, Any]

POD_SPEC_ORDER = (
    "volumes", "initContainers", "containers", "ephemeralContainers", "restartPolicy",
    "terminationGracePeriodSeconds", "activeDeadlineSeconds", "dnsPolicy", "nodeSelector",
    "serviceAccountName", "serviceAccount", "automountServiceAccountToken", "nodeName", "hostNetwork",
    "hostPID", "hostIPC", "shareProcessNamespace", "securityContext", "imagePullSecrets", "hostname",
    "subdomain", "affinity", "schedulerName", "tolerations", "hostAliases", "priorityClassName", "priority",
    "dnsConfig", "readinessGates", "runtimeClassName", "enableServiceLinks", "preemptionPolicy", "overhead",
    "topologySpreadConstraints", "setHostnameAsFQDN", "os", "hostUsers", "schedulingGates", "resourceClaims",
    "resources",
)  # fmt: skip
CONTAINER_ORDER = (
    "name", "image", "command", "args", "workingDir", "ports", "envFrom", "env", "resources", "resizePolicy",
    "restartPolicy", "volumeMounts", "volumeDevices", "livenessProbe", "readinessProbe", "startupProbe",
    "lifecycle", "terminationMessagePath", "terminationMessagePolicy", "imagePullPolicy", "securityContext",
    "stdin", "stdinOnce", "tty",
)  # fmt: skip
POD_STATUS_ORDER = (
    "observedGeneration", "phase", "conditions", "message", "reason", "nominatedNodeName", "hostIP",
    "hostIPs", "podIP", "podIPs", "startTime", "initContainerStatuses", "containerStatuses", "qosClass",
    "ephemeralContainerStatuses", "resize", "resourceClaimStatuses",
)  # fmt: skip

CONDITION_ORDER = (
    "type",
    "observedGeneration",
    "status",
    "lastProbeTime",
    "lastTransitionTime",
    "reason",
    "message",
)
DEFAULT_TOLERATIONS = (
    {
        "key": "node.kubernetes.io/not-ready",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 300,
    },
    {
        "key": "node.kubernetes.io/unreachable",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 300,
    },
)
GATED_CONDITION_MESSAGE = "Scheduling is blocked due to non-empty scheduling gates"
UPDATE_FORBIDDEN = (
    "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,"
    "`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),"
    "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)"
)


class PodBehaviour(KindBehaviour):
    returns_deleted_object = True
    graceful_deletion = True

    def prepare_create(self, obj: JsonObj, now: str) -> None:
        spec = obj.setdefault("spec", {})
        for kind in ("initContainers", "containers"):
            if spec.get(kind):
                spec[kind] = [_default_container(c) for c in spec[kind]]
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        spec.setdefault("dnsPolicy", "ClusterFirst")
        account = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
        spec["serviceAccountName"] = spec["serviceAccount"] = account
        spec.setdefault("securityContext", {})
        spec.setdefault("schedulerName", "default-scheduler")
        spec["tolerations"] = _with_default_tolerations(spec.get("tolerations") or [])
        spec.setdefault("priority", 0)
        spec.setdefault("enableServiceLinks", True)
        spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
        obj["spec"] = reorder(spec, POD_SPEC_ORDER)

        status: JsonObj = {"phase": "Pending"}
        if spec.get("schedulingGates"):
            status["conditions"] = [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "lastProbeTime": None,
                    "lastTransitionTime": now,
                    "reason": "SchedulingGated",
                    "message": GATED_CONDITION_MESSAGE,
                }
            ]
        status["qosClass"] = qos_class(spec)
        obj["status"] = status

    def validate_create(self, obj: JsonObj) -> list[FieldError]:
        spec = obj.get("spec") or {}
        errs: list[FieldError] = []
        if not spec.get("containers"):
            errs.append(FieldError("Required", "spec.containers"))
        for kind in ("initContainers", "containers"):
            for i, container in enumerate(spec.get(kind) or []):
                if not container.get("name"):
                    errs.append(FieldError("Required", f"spec.{kind}[{i}].name"))
                if not container.get("image"):
                    errs.append(FieldError("Required", f"spec.{kind}[{i}].image"))
        names = [g.get("name", "") for g in spec.get("schedulingGates") or []]
        for i, name in enumerate(names):
            if name in names[:i]:
                errs.append(FieldError("Duplicate", f"spec.schedulingGates[{i}]", value=name))
        return errs

    def validate_update(self, old: JsonObj, new: JsonObj) -> list[FieldError]:
        old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
        errs = scheduling_gate_errors(old_spec, new_spec)
        # A gated pod's scheduling directives may be narrowed (KEP-3838, GA in 1.30): nodeSelector
        # entries added, required node affinity set where there was none or its terms' expressions
        # and fields added to (measured on both real releases: bench/pinning.py).
        gated = bool(old_spec.get("schedulingGates"))
        directives_ok = _only_narrowed(old_spec, new_spec) if gated else True
        if (
            _immutable_view(old_spec, gated) != _immutable_view(new_spec, gated)
            or not _tolerations_only_added(old_spec, new_spec)
            or not directives_ok
        ):
            errs.append(FieldError("Forbidden", "spec", UPDATE_FORBIDDEN))
        return errs

    def canonicalise(self, obj: JsonObj) -> None:
        spec = obj.get("spec")
        if isinstance(spec, dict):
            for kind in ("initContainers", "containers"):
                if isinstance(spec.get(kind), list):
                    spec[kind] = [_ordered(c, CONTAINER_ORDER) for c in spec[kind]]
            obj["spec"] = reorder(spec, POD_SPEC_ORDER)
        status = obj.get("status")
        if isinstance(status, dict):
            if isinstance(status.get("conditions"), list):
                status["conditions"] = [_condition(c) for c in status["conditions"]]
            obj["status"] = reorder(status, POD_STATUS_ORDER)

    def grace_period(self, obj: JsonObj, requested: int | None) -> int:
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        # With no node, or once the pod finished, nothing has to stop: the apiserver deletes at once.
        if not spec.get("nodeName") or status.get("phase") in ("Succeeded", "Failed"):
            return 0
        grace = int(requested if requested is not None else spec.get("terminationGracePeriodSeconds", 30))
        return 1 if grace < 0 else grace


def scheduling_gate_errors(old_spec: JsonObj, new_spec: JsonObj) -> list[FieldError]:
    """Gates may only be removed after creation; the error names the index in the new list."""
    existing = {g.get("name") for g in old_spec.get("schedulingGates") or []}
    errs = []
    for i, gate in enumerate(new_spec.get("schedulingGates") or []):
        if gate.get("name") not in existing:
            errs.append(
                FieldError(
                    "Forbidden",
                    f"spec.schedulingGates[{i}].name",
                    f"only deletion is allowed, but found new scheduling gate '{gate.get('name')}'",
                )
            )
    return errs


def binding_refusal(pod: JsonObj) -> str | None:
    """Why the apiserver would refuse to bind `pod` (worded as its 409 messages), or None."""
    name = pod["metadata"]["name"]
    spec = pod.get("spec") or {}
    if pod["metadata"].get("deletionTimestamp"):
        return f"pod {name} is being deleted, cannot be assigned to a host"
    if spec.get("nodeName"):
        return f'pod {name} is already assigned to node "{spec["nodeName"]}"'
    if spec.get("schedulingGates"):
        return f"pod {name} has non-empty .spec.schedulingGates"
    return None


def bound(pod: JsonObj, node: str, annotations: JsonObj, now: str) -> JsonObj:
    """The pod after a successful Binding: node set, annotations merged, PodScheduled=True."""
    out = copy.deepcopy(pod)
    if annotations:
        meta = out["metadata"]
        meta["annotations"] = {**(meta.get("annotations") or {}), **annotations}
    out["spec"]["nodeName"] = node
    out["spec"] = reorder(out["spec"], POD_SPEC_ORDER)
    status = out.setdefault("status", {})
    scheduled = {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": now}
    others = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
    status["conditions"] = [*others, scheduled]
    out["status"] = reorder(status, POD_STATUS_ORDER)
    return out


def qos_class(spec: JsonObj) -> str:
    """Guaranteed / Burstable / BestEffort from the cpu and memory requests and limits (after defaulting)."""
    containers = (spec.get("initContainers") or []) + (spec.get("containers") or [])
    any_set = False
    guaranteed = True
    for container in containers:
        resources = container.get("resources") or {}
        requests = _compute(resources.get("requests"))
        limits = _compute(resources.get("limits"))
        any_set = any_set or bool(requests) or bool(limits)
        if set(limits) != {"cpu", "memory"} or requests != limits:
            guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def _compute(quantities: JsonObj | None) -> dict[str, Decimal]:
    out = {}
    for name in ("cpu", "memory"):
        if quantities and name in quantities:
            value = parse_quantity(str(quantities[name]))
            if value:
                out[name] = value
    return out


_DECIMAL_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SUFFIXES = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_SUFFIXES = {
    **{s: Decimal(10) ** e for s, e in _DECIMAL_SUFFIXES.items()},
    **{s: Decimal(2) ** e for s, e in _BINARY_SUFFIXES.items()},
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+|[a-zA-Z]*)$")


def parse_quantity(text: str) -> Decimal:
    """A Kubernetes quantity as a number, enough to compare requests with limits."""
    m = _QUANTITY.match(text.strip())
    if not m:
        raise ValueError(f"quantities must match the regular expression: {text!r}")
    number, suffix = m.groups()
    try:
        if suffix[:1] in ("e", "E"):
            return Decimal(number + suffix)
        return Decimal(number) * _SUFFIXES[suffix]
    except (InvalidOperation, KeyError) as exc:
        raise ValueError(f"unable to parse quantity's suffix: {text!r}") from exc


def _condition(condition: Any) -> Any:
    """PodCondition as Go writes it: lastProbeTime/lastTransitionTime always present (null when unset)."""
    if not isinstance(condition, dict):
        return condition
    return reorder({"lastProbeTime": None, "lastTransitionTime": None, **condition}, CONDITION_ORDER)


def _ordered(value: Any, order: tuple[str, ...]) -> Any:
    return reorder(value, order) if isinstance(value, dict) else value


def _default_container(container: JsonObj) -> JsonObj:
    c = copy.deepcopy(container)
    resources = c.setdefault("resources", {})
    limits = resources.get("limits") or {}
    if limits:
        # Requests default to limits, per resource.
        resources["requests"] = {**limits, **(resources.get("requests") or {})}
    # limits and requests are maps (sorted, as Go writes them); claims is a list (kept as given).
    c["resources"] = {
        k: dict(sorted(v.items())) if isinstance(v, dict) else v for k, v in sorted(resources.items())
    }
    c.setdefault("terminationMessagePath", "/dev/termination-log")
    c.setdefault("terminationMessagePolicy", "File")
    c.setdefault("imagePullPolicy", _pull_policy(c.get("image", "")))
    return reorder(c, CONTAINER_ORDER)


def _pull_policy(image: str) -> str:
    if "@" in image:
        return "IfNotPresent"
    tail = image.rsplit("/", 1)[-1]
    tag = tail.split(":", 1)[1] if ":" in tail else ""
    return "Always" if tag in ("", "latest") else "IfNotPresent"


def _with_default_tolerations(tolerations: list[JsonObj]) -> list[JsonObj]:
    out = list(tolerations)
    for default in DEFAULT_TOLERATIONS:
        if not any(
            t.get("key") == default["key"] and t.get("effect") in (None, "", "NoExecute") for t in out
        ):
            out.append(dict(default))
    return out


REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def _only_narrowed(old_spec: JsonObj, new_spec: JsonObj) -> bool:
    """A gated pod's nodeSelector and required node affinity changed only by additions."""
    old_sel, new_sel = old_spec.get("nodeSelector") or {}, new_spec.get("nodeSelector") or {}
    if any(new_sel.get(k) != v for k, v in old_sel.items()):
        return False
    old_aff = (old_spec.get("affinity") or {}).get("nodeAffinity") or {}
    new_aff = (new_spec.get("affinity") or {}).get("nodeAffinity") or {}
    if {k: v for k, v in old_aff.items() if k != REQUIRED} != {
        k: v for k, v in new_aff.items() if k != REQUIRED
    }:
        return False
    old_terms = (old_aff.get(REQUIRED) or {}).get("nodeSelectorTerms") or []
    new_terms = (new_aff.get(REQUIRED) or {}).get("nodeSelectorTerms") or []
    if not old_terms:
        return True
    if len(old_terms) != len(new_terms):
        return False
    for old_term, new_term in zip(old_terms, new_terms, strict=True):
        for part in ("matchExpressions", "matchFields"):
            if any(e not in (new_term.get(part) or []) for e in old_term.get(part) or []):
                return False
    return True


def _immutable_view(spec: JsonObj, gated: bool = False) -> JsonObj:
    """The spec without the fields an update may change (a gated pod's scheduling directives too)."""
    view = copy.deepcopy(spec)
    if gated:
        view.pop("nodeSelector", None)
        affinity = view.get("affinity")
        if isinstance(affinity, dict):
            affinity.pop("nodeAffinity", None)
            if not affinity:
                view.pop("affinity")
    for kind in ("initContainers", "containers"):
        for container in view.get(kind) or []:
            container.pop("image", None)
    for mutable in (
        "activeDeadlineSeconds",
        "tolerations",
        "terminationGracePeriodSeconds",
        "schedulingGates",
    ):
        view.pop(mutable, None)
    return view


def _tolerations_only_added(old_spec: JsonObj, new_spec: JsonObj) -> bool:
    new = new_spec.get("tolerations") or []
    return all(t in new for t in old_spec.get("tolerations") or [])
