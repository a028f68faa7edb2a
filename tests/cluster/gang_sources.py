"""The three ways a user defines a gang, for the real-cluster gang scenarios to run over (no pytest
here): scheduler-plugins' PodGroup (every release), Kubernetes' own v1alpha2 PodGroup (1.36; with
kube-scheduler's GangScheduling plugin, topoalloc steering, and without it, topoalloc gating) and a
v1alpha1 Workload's pod group (1.35). Each says how to create the gang's object, how a pod joins it,
where its Events go and what state the gang shows. A module runs its scenarios over them with
`pytestmark = gang_sources(...)` (the `gang_source` fixture, tests/cluster/conftest.py). pytest is
imported only there: bench/gang_burst.py uses the sources too."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tests.support.controlplane import ApiStatus, ControlPlane

if TYPE_CHECKING:
    import pytest

JSON = dict[str, Any]
CONTROLLER = "topoalloc.io/allocator"
WAITING_TIME = "gang.scheduling.koordinator.sh/waiting-time"
SP_PODGROUPS = "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups"
NATIVE_PODGROUPS = "/apis/scheduling.k8s.io/v1alpha2/namespaces/{ns}/podgroups"
WORKLOADS = "/apis/scheduling.k8s.io/v1alpha1/namespaces/{ns}/workloads"
POD_GROUP = "workers"  # the pod group of a 1.35 Workload


@dataclass(frozen=True)
class GangSource:
    id: str
    releases: tuple[str, ...]  # the minors that serve it
    gated: bool  # topoalloc's webhook gates the members until their gang is planned
    kube_scheduler_plugin: bool = True  # False: kube-scheduler runs without GangScheduling

    @property
    def kind(self) -> str:
        """The kind of the object Events about the gang are on."""
        return "Workload" if self.id == "workload" else "PodGroup"

    @property
    def native(self) -> bool:
        return self.id != "scheduler-plugins"

    # -- the gang's object ---------------------------------------------------------------------

    def create(
        self,
        cp: ControlPlane,
        ns: str,
        name: str,
        min_member: int,
        *,
        timeout: int | None = None,
        min_resources: dict[str, str] | None = None,
    ) -> None:
        """The gang's object; `timeout` as the source states one (scheduleTimeoutSeconds, else
        the waiting-time annotation); `min_resources` exists for scheduler-plugins only."""
        meta: JSON = {"name": name}
        if timeout is not None and self.native:
            meta["annotations"] = {WAITING_TIME: f"{timeout}s"}
        if not self.native:
            spec: JSON = {"minMember": min_member, "minResources": min_resources or None}
            spec["scheduleTimeoutSeconds"] = timeout
            body = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": meta}
            cp.admin.post(SP_PODGROUPS.format(ns=ns), {**body, "spec": {k: v for k, v in spec.items() if v}})
        elif self.id == "workload":
            policy = {"name": POD_GROUP, "policy": {"gang": {"minCount": min_member}}}
            body = {"apiVersion": "scheduling.k8s.io/v1alpha1", "kind": "Workload", "metadata": meta}
            cp.admin.post(WORKLOADS.format(ns=ns), {**body, "spec": {"podGroups": [policy]}})
        else:
            body = {"apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "PodGroup", "metadata": meta}
            spec = {"schedulingPolicy": {"gang": {"minCount": min_member}}}
            cp.admin.post(NATIVE_PODGROUPS.format(ns=ns), {**body, "spec": spec})

    def join(self, pod: JSON, group: str) -> JSON:
        """`pod` (or a pod template) made a member of gang `group`."""
        if not self.native:
            pod["metadata"].setdefault("labels", {})["scheduling.x-k8s.io/pod-group"] = group
        elif self.id == "workload":
            pod["spec"]["workloadRef"] = {"name": group, "podGroup": POD_GROUP}
        else:
            pod["spec"]["schedulingGroup"] = {"podGroupName": group}
        return pod

    def get(self, cp: ControlPlane, ns: str, name: str) -> JSON:
        path = {"scheduler-plugins": SP_PODGROUPS, "workload": WORKLOADS}.get(self.id, NATIVE_PODGROUPS)
        return dict(cp.admin.get(f"{path.format(ns=ns)}/{name}"))

    def describe(self, cp: ControlPlane, ns: str, name: str) -> str:
        """`kubectl describe` of the gang's object (the kind fully qualified: two PodGroups exist)."""
        resource = {
            "scheduler-plugins": "podgroups.v1alpha1.scheduling.x-k8s.io",
            "workload": "workloads.v1alpha1.scheduling.k8s.io",
        }.get(self.id, "podgroups.v1alpha2.scheduling.k8s.io")
        return cp.kubectl("describe", resource, name, "-n", ns).stdout

    # -- what it shows ---------------------------------------------------------------------------

    def state(self, cp: ControlPlane, ns: str, name: str, events: list[JSON]) -> str:
        """The gang's state as the user reads it: a scheduler-plugins PodGroup's phase; for a
        native PodGroup topoalloc's conditions (Failed, Scheduled, else Waiting or Pending); for a
        Workload (no status) the Events on it."""
        if not self.native:
            return str((self.get(cp, ns, name).get("status") or {}).get("phase", ""))
        if self.id == "workload":
            reasons = {e["reason"] for e in gang_events(events, self.kind, name)}
            return next(
                (s for r, s in (("GangFailed", "Failed"), ("GangScheduled", "Scheduled")) if r in reasons), ""
            )
        try:
            conditions = (self.get(cp, ns, name).get("status") or {}).get("conditions") or []
        except ApiStatus:
            return ""
        mine = {c["type"].removeprefix("topoalloc.io/"): c["status"] for c in conditions}
        for kind, state in (("TimedOut", "Failed"), ("Scheduled", "Scheduled"), ("Waiting", "Waiting")):
            if mine.get(kind) == "True":
                return state
        return "Pending" if mine else ""


def gang_events(events: list[JSON], kind: str, name: str = "", reason: str = "") -> list[JSON]:
    """topoalloc's gang Events about objects of `kind` (`name`, `reason` when given)."""
    return [
        e
        for e in events
        if e.get("reportingComponent") == CONTROLLER
        and e["involvedObject"]["kind"] == kind
        and (not name or e["involvedObject"]["name"] == name)
        and (not reason or e["reason"] == reason)
    ]


SCHEDULER_PLUGINS = GangSource("scheduler-plugins", ("1.35", "1.36"), gated=True)
NATIVE = GangSource("native", ("1.36",), gated=False)
NATIVE_WITHOUT_PLUGIN = GangSource("native-no-plugin", ("1.36",), gated=True, kube_scheduler_plugin=False)
WORKLOAD = GangSource("workload", ("1.35",), gated=False)
SOURCES = (SCHEDULER_PLUGINS, NATIVE, NATIVE_WITHOUT_PLUGIN, WORKLOAD)


def gang_sources(*sources: GangSource) -> pytest.MarkDecorator:
    """Run every test of a module that uses `gang_source` once per source (default: all four);
    pytest groups the tests by source, so a source that needs kube-scheduler restarted does so once."""
    import pytest

    chosen = sources or SOURCES
    ids = [s.id for s in chosen]
    return pytest.mark.parametrize("gang_source", chosen, indirect=True, ids=ids, scope="module")
