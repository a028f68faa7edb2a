"""PodGroup (scheduling.x-k8s.io/v1alpha1, scheduler-plugins) and how a pod names its gang: that
PodGroup, Koordinator's annotations, or Kubernetes' own gang API (apis/workload.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from apis import decode as d
from apis import keys, workload
from apis.errors import CodecError
from apis.gojson import sorted_map
from apis.quantity import Quantity

GROUP = "scheduling.x-k8s.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "PodGroup"
PLURAL = "podgroups"

PHASES = ("Pending", "PreScheduling", "Scheduling", "Scheduled", "Running", "Finished", "Failed", "Unknown")


@dataclass
class PodGroupStatus:
    phase: str = ""
    occupied_by: str = ""
    scheduled: int = 0
    running: int = 0
    succeeded: int = 0
    failed: int = 0
    schedule_start_time: str = ""
    # metav1.Condition objects as written (Scheduled, Waiting, Preempting, TimedOut), kept raw.
    conditions: list[dict[str, Any]] = field(default_factory=list)

    FIELDS = (
        "phase",
        "occupiedBy",
        "scheduled",
        "running",
        "succeeded",
        "failed",
        "scheduleStartTime",
        "conditions",
    )

    @classmethod
    def from_dict(cls, value: Any, path: str) -> PodGroupStatus:
        data = d.struct(value, path, cls.FIELDS)
        phase = d.string(data, "phase", path)
        if phase:
            d.one_of(phase, PHASES, d.join(path, "phase"))
        counts = {
            n: d.integer(data, n, path, minimum=0) for n in ("scheduled", "running", "succeeded", "failed")
        }
        cpath = d.join(path, "conditions")
        conditions = [d.obj(c, d.join(cpath, i)) for i, c in enumerate(d.array(data, "conditions", path))]
        return cls(
            phase=phase,
            occupied_by=d.string(data, "occupiedBy", path),
            schedule_start_time=d.string(data, "scheduleStartTime", path),
            conditions=conditions,
            **counts,
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, val in (
            ("phase", self.phase),
            ("occupiedBy", self.occupied_by),
            ("scheduled", self.scheduled),
            ("running", self.running),
            ("succeeded", self.succeeded),
            ("failed", self.failed),
            ("scheduleStartTime", self.schedule_start_time),
            ("conditions", self.conditions),
        ):
            if val:
                out[name] = val
        return out


@dataclass
class PodGroup:
    metadata: dict[str, Any]
    min_member: int = 0
    min_resources: dict[str, Quantity] = field(default_factory=dict)
    schedule_timeout_seconds: int | None = None
    status: PodGroupStatus = field(default_factory=PodGroupStatus)

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))

    @property
    def namespace(self) -> str:
        return str(self.metadata.get("namespace", ""))

    @classmethod
    def from_dict(cls, value: Any, path: str = "") -> PodGroup:
        data = d.struct(value, path, ("apiVersion", "kind", "metadata", "spec", "status"))
        api = d.string(data, "apiVersion", path)
        if api and api != API_VERSION:
            raise CodecError(d.join(path, "apiVersion"), f"expected {API_VERSION}", api)
        spath = d.join(path, "spec")
        spec = d.struct(
            data.get("spec") or {}, spath, ("minMember", "minResources", "scheduleTimeoutSeconds")
        )
        rpath = d.join(spath, "minResources")
        resources = {
            k: Quantity.parse(v, d.join(rpath, k))
            for k, v in d.obj(spec.get("minResources") or {}, rpath).items()
        }
        return cls(
            metadata=d.obj(data.get("metadata") or {}, d.join(path, "metadata")),
            min_member=d.integer(spec, "minMember", spath, minimum=0),
            min_resources=resources,
            schedule_timeout_seconds=d.integer(
                spec, "scheduleTimeoutSeconds", spath, default=None, minimum=0
            ),
            status=PodGroupStatus.from_dict(data.get("status") or {}, d.join(path, "status")),
        )

    def to_dict(self) -> dict[str, Any]:
        spec: dict[str, Any] = {}
        if self.min_member:
            spec["minMember"] = self.min_member
        if self.min_resources:
            spec["minResources"] = sorted_map({k: str(v) for k, v in self.min_resources.items()})
        if self.schedule_timeout_seconds is not None:
            spec["scheduleTimeoutSeconds"] = self.schedule_timeout_seconds
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": self.metadata,
            "spec": spec,
            "status": self.status.to_dict(),
        }


# Where a gang is defined (GangRef.source).
PODGROUP_SOURCE = "podgroup"  # scheduler-plugins PodGroup, named by the pod-group label
LEGACY_SOURCE = "podgroup-legacy"  # the same, by the legacy label
KOORDINATOR_SOURCE = "koordinator"  # no object: the members' annotations say it all
NATIVE_SOURCE = "native"  # scheduling.k8s.io/v1alpha2 PodGroup (Kubernetes 1.36)
WORKLOAD_SOURCE = "workload"  # a pod group of a scheduling.k8s.io/v1alpha1 Workload (Kubernetes 1.35)
NATIVE_SOURCES = (NATIVE_SOURCE, WORKLOAD_SOURCE)


@dataclass(frozen=True)
class GangRef:
    """Which gang a pod belongs to. `min_available` is set only for PodGroup-less Koordinator gangs;
    `workload` and `pod_group` only for a 1.35 Workload's pod group, whose gang is named
    `WORKLOAD/POD_GROUP` (`/REPLICA_KEY` added for a replica)."""

    namespace: str
    name: str
    source: str  # one of the *_SOURCE names above
    min_available: int | None = None
    workload: str = ""
    pod_group: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def native(self) -> bool:
        """kube-scheduler knows this gang (and may run its own gang plugin on it)."""
        return self.source in NATIVE_SOURCES

    @property
    def object_key(self) -> str:
        """NS/NAME of the API object that defines the gang ("" for Koordinator gangs)."""
        if self.source == KOORDINATOR_SOURCE:
            return ""
        return f"{self.namespace}/{self.workload or self.name}"


def gang_of(pod: dict[str, Any]) -> GangRef | None:
    """The gang a pod names: Kubernetes' own (spec.schedulingGroup, spec.workloadRef) first, as
    kube-scheduler reads it; then the PodGroup label (new or legacy); then Koordinator's annotations."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    namespace = meta.get("namespace") or "default"
    native = workload.membership(pod)
    if native is not None and not native.workload:
        return GangRef(namespace, native.pod_group, NATIVE_SOURCE)
    if native is not None:
        name = "/".join(p for p in (native.workload, native.pod_group, native.replica) if p)
        return GangRef(namespace, name, WORKLOAD_SOURCE, workload=native.workload, pod_group=native.pod_group)
    if labels.get(keys.POD_GROUP_LABEL):
        return GangRef(namespace, labels[keys.POD_GROUP_LABEL], PODGROUP_SOURCE)
    if labels.get(keys.POD_GROUP_LABEL_LEGACY):
        return GangRef(namespace, labels[keys.POD_GROUP_LABEL_LEGACY], LEGACY_SOURCE)
    name = annotations.get(keys.GANG_NAME) or labels.get(keys.GANG_NAME)
    if not name:
        return None
    raw = annotations.get(keys.GANG_MIN_AVAILABLE) or labels.get(keys.GANG_MIN_AVAILABLE)
    min_available = None
    if raw is not None:
        try:
            min_available = int(raw, 10)
        except (TypeError, ValueError):
            raise CodecError(keys.GANG_MIN_AVAILABLE, "must be a positive integer", raw) from None
        if min_available <= 0:
            raise CodecError(keys.GANG_MIN_AVAILABLE, "must be a positive integer", raw)
    return GangRef(namespace, name, KOORDINATOR_SOURCE, min_available)


def spec_priority(spec: Any) -> int:
    """A pod's `spec.priority`: the value of its PriorityClass, filled in by the API server's
    Priority admission (0 without a class and without a global default, as kube-scheduler reads
    it). Anything but an integer counts as 0."""
    value = spec.get("priority") if isinstance(spec, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
