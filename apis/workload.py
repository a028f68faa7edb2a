"""Kubernetes' own gang API (scheduling.k8s.io, workload-aware scheduling, KEP-4671), both alphas.

* 1.36: `v1alpha2` **PodGroup** (the runtime gang: `spec.schedulingPolicy` is `basic: {}` or
  `gang: {minCount}`, `status.conditions`), made by hand or from a `v1alpha2` Workload's template;
  a pod joins with `spec.schedulingGroup.podGroupName`.
* 1.35: `v1alpha1` **Workload** (`spec.podGroups[]`, each `{name, policy: basic | gang}`, no
  status); a pod joins with `spec.workloadRef {name, podGroup, podGroupReplicaKey}`.

Field names as the v1.36.3 and v1.35.6 API servers serve them (/openapi/v3). Only what topoalloc
reads is decoded; every other field is left alone. Both are alpha: off by default, and a server
serves one of them at most (1.36 dropped v1alpha1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from apis import decode as d
from apis.errors import CodecError

GROUP = "scheduling.k8s.io"
V1ALPHA2 = "v1alpha2"
V1ALPHA1 = "v1alpha1"
PODGROUP_API_VERSION = f"{GROUP}/{V1ALPHA2}"
WORKLOAD_API_VERSION = f"{GROUP}/{V1ALPHA1}"
PODGROUP_KIND = "PodGroup"
WORKLOAD_KIND = "Workload"
PODGROUPS = "podgroups"
WORKLOADS = "workloads"

# kube-scheduler's gang plugin writes `PodGroupScheduled` itself; topoalloc's explanations go under
# condition types of its own, prefixed with its domain, so neither overwrites the other's.
CONDITION_PREFIX = "topoalloc.io/"


@dataclass(frozen=True)
class SchedulingPolicy:
    """`basic: {}` (pods placed one by one: min_count None) or `gang: {minCount}`."""

    min_count: int | None = None

    @property
    def gang(self) -> bool:
        return self.min_count is not None

    @classmethod
    def from_dict(cls, value: Any, path: str) -> SchedulingPolicy:
        data = d.struct(value, path, ("basic", "gang"))
        present = [k for k in ("basic", "gang") if data.get(k) is not None]
        if len(present) != 1:
            raise CodecError(path, "exactly one of basic, gang must be set", sorted(data))
        if present == ["basic"]:
            d.obj(data["basic"], d.join(path, "basic"))
            return cls(None)
        gpath = d.join(path, "gang")
        gang = d.struct(data["gang"], gpath, ("minCount",))
        return cls(d.integer(gang, "minCount", gpath, required=True, minimum=1))


@dataclass
class NativePodGroup:
    """A `scheduling.k8s.io/v1alpha2` PodGroup."""

    metadata: dict[str, Any]
    policy: SchedulingPolicy
    # Only with the WorkloadAwarePreemption gate; read, not used for queue order (docs/gang.md).
    priority: int | None = None
    template: tuple[str, str] | None = None  # (workloadName, podGroupTemplateName)
    conditions: list[dict[str, Any]] = field(default_factory=list)  # everyone's, raw

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))

    @classmethod
    def from_dict(cls, value: Any, path: str = "") -> NativePodGroup:
        data = d.struct(value, path, ("apiVersion", "kind", "metadata", "spec", "status"))
        _api_version(data, path, PODGROUP_API_VERSION)
        spath = d.join(path, "spec")
        spec = d.struct(data.get("spec"), spath, ("schedulingPolicy", "priority", "podGroupTemplateRef"))
        if spec.get("schedulingPolicy") is None:
            raise CodecError(d.join(spath, "schedulingPolicy"), "is required", None, show_value=False)
        template = None
        rpath = d.join(spath, "podGroupTemplateRef")
        if spec.get("podGroupTemplateRef") is not None:
            ref = d.struct(spec["podGroupTemplateRef"], rpath, ("workload",))
            wpath = d.join(rpath, "workload")
            if ref.get("workload") is not None:
                w = d.struct(ref["workload"], wpath, ("workloadName", "podGroupTemplateName"))
                template = (
                    d.string(w, "workloadName", wpath, required=True),
                    d.string(w, "podGroupTemplateName", wpath, required=True),
                )
        stpath = d.join(path, "status")
        status = d.struct(data.get("status") or {}, stpath, ("conditions",))
        return cls(
            metadata=d.obj(data.get("metadata") or {}, d.join(path, "metadata")),
            policy=SchedulingPolicy.from_dict(spec["schedulingPolicy"], d.join(spath, "schedulingPolicy")),
            priority=d.integer(spec, "priority", spath, default=None),
            template=template,
            conditions=_conditions(status, stpath),
        )


@dataclass
class WorkloadV1Alpha1:
    """A `scheduling.k8s.io/v1alpha1` Workload: its pod groups by name."""

    metadata: dict[str, Any]
    pod_groups: dict[str, SchedulingPolicy]

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))

    @classmethod
    def from_dict(cls, value: Any, path: str = "") -> WorkloadV1Alpha1:
        data = d.struct(value, path, ("apiVersion", "kind", "metadata", "spec"))
        _api_version(data, path, WORKLOAD_API_VERSION)
        spath = d.join(path, "spec")
        spec = d.struct(data.get("spec"), spath, ("podGroups",))
        groups: dict[str, SchedulingPolicy] = {}
        gpath = d.join(spath, "podGroups")
        for i, item in enumerate(d.array(spec, "podGroups", spath)):
            ipath = d.join(gpath, i)
            group = d.struct(item, ipath, ("name", "policy"))
            name = d.string(group, "name", ipath, required=True)
            if name in groups:
                raise CodecError(d.join(ipath, "name"), "names another pod group of this Workload", name)
            groups[name] = SchedulingPolicy.from_dict(group.get("policy") or {}, d.join(ipath, "policy"))
        return cls(metadata=d.obj(data.get("metadata") or {}, d.join(path, "metadata")), pod_groups=groups)


@dataclass(frozen=True)
class Membership:
    """The native group a pod names: a 1.36 PodGroup (`workload` empty) or a 1.35 Workload's pod
    group (and replica)."""

    pod_group: str
    workload: str = ""
    replica: str = ""


def membership(pod: Any) -> Membership | None:
    """The pod's `spec.schedulingGroup` (1.36) or `spec.workloadRef` (1.35); None for neither.
    Raises CodecError naming the field for a malformed one."""
    spec = pod.get("spec") if isinstance(pod, dict) else None
    if not isinstance(spec, dict):
        return None
    group, ref = spec.get("schedulingGroup"), spec.get("workloadRef")
    if group is not None:
        path = "spec.schedulingGroup"
        data = d.struct(group, path, ("podGroupName",))
        return Membership(d.string(data, "podGroupName", path, required=True))
    if ref is not None:
        path = "spec.workloadRef"
        data = d.struct(ref, path, ("name", "podGroup", "podGroupReplicaKey"))
        return Membership(
            pod_group=d.string(data, "podGroup", path, required=True),
            workload=d.string(data, "name", path, required=True),
            replica=d.string(data, "podGroupReplicaKey", path),
        )
    return None


def _api_version(data: dict[str, Any], path: str, want: str) -> None:
    api = d.string(data, "apiVersion", path)
    if api and api != want:
        raise CodecError(d.join(path, "apiVersion"), f"expected {want}", api)


def _conditions(status: dict[str, Any], path: str) -> list[dict[str, Any]]:
    cpath = d.join(path, "conditions")
    return [d.obj(c, d.join(cpath, i)) for i, c in enumerate(d.array(status, "conditions", path))]
