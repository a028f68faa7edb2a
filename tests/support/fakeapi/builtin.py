"""The resource types a fresh fake serves: the core kinds topoalloc touches, Leases, and its two CRDs."""

from __future__ import annotations

from collections.abc import Mapping

from .behaviour import DEFAULT_BEHAVIOUR, KindBehaviour
from .kinds import (
    CoreEventBehaviour,
    EventsV1Behaviour,
    NamespaceBehaviour,
    core_event_to_v1,
    v1_event_to_core,
)
from .pods import PodBehaviour
from .pruning import PrunedCustomResource, crd_schema
from .resources import METADATA_FIELDS, FieldGetter, Registry, ResourceType, ViewConversion, path_getter
from .strategic import MergeList, Schema

# Strategic-merge keys of the built-in types (from the Go struct tags of k8s.io/api).
_META: Schema = {"finalizers": MergeList(None), "ownerReferences": MergeList("uid")}
_CONTAINER: Schema = {
    "ports": MergeList("containerPort"),
    "env": MergeList("name"),
    "volumeMounts": MergeList("mountPath"),
    "volumeDevices": MergeList("devicePath"),
    "resizePolicy": MergeList("resourceName"),
}
POD_SCHEMA: Schema = {
    "metadata": _META,
    "spec": {
        "containers": MergeList("name", _CONTAINER),
        "initContainers": MergeList("name", _CONTAINER),
        "ephemeralContainers": MergeList("name", _CONTAINER),
        "volumes": MergeList("name"),
        "imagePullSecrets": MergeList("name"),
        "hostAliases": MergeList("ip"),
        "topologySpreadConstraints": MergeList("topologyKey"),
        "schedulingGates": MergeList("name"),
        "resourceClaims": MergeList("name"),
    },
    "status": {
        "conditions": MergeList("type"),
        "podIPs": MergeList("ip"),
        "hostIPs": MergeList("ip"),
        "resourceClaimStatuses": MergeList("name"),
    },
}
NODE_SCHEMA: Schema = {
    "metadata": _META,
    "spec": {"podCIDRs": MergeList(None)},
    "status": {"conditions": MergeList("type"), "addresses": MergeList("type")},
}
NAMESPACE_SCHEMA: Schema = {"metadata": _META, "status": {"conditions": MergeList("type")}}
METADATA_ONLY_SCHEMA: Schema = {"metadata": _META}

_EMPTY_NODE_INFO = dict.fromkeys(
    (
        "machineID", "systemUUID", "bootID", "kernelVersion", "osImage", "containerRuntimeVersion",
        "kubeletVersion", "kubeProxyVersion", "operatingSystem", "architecture",
    ),
    "",
)  # fmt: skip


def field_getters(namespaced: bool, extra: Mapping[str, FieldGetter] | None = None) -> dict[str, FieldGetter]:
    """`metadata.name` (and `metadata.namespace` when namespaced) plus the kind's own field labels."""
    getters = {k: v for k, v in METADATA_FIELDS.items() if namespaced or k != "metadata.namespace"}
    getters.update(extra or {})
    return getters


def _pod_type() -> ResourceType:
    extra = {f: path_getter(*f.split(".")) for f in (
        "spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
        "spec.hostNetwork", "status.phase", "status.podIP", "status.nominatedNodeName",
    )}  # fmt: skip
    return ResourceType(
        group="",
        version="v1",
        plural="pods",
        kind="Pod",
        namespaced=True,
        behaviour=PodBehaviour(),
        singular="pod",
        short_names=("po",),
        field_getters=field_getters(True, extra),
        merge_schema=POD_SCHEMA,
        bookmark_body={"spec": {"containers": None}, "status": {}},
        extra_subresources={"binding": ("Binding", ("create",)), "eviction": ("Eviction", ("create",))},
    )


def _event_getters() -> dict[str, FieldGetter]:
    fields = {f"involvedObject.{f}": path_getter("involvedObject", f) for f in (
        "kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath",
    )}  # fmt: skip
    fields.update(
        reason=path_getter("reason"),
        reportingComponent=path_getter("reportingComponent"),
        source=path_getter("source", "component"),
        type=path_getter("type"),
    )
    return field_getters(True, fields)


def builtin_types() -> list[ResourceType]:
    core_events = ResourceType(
        group="",
        version="v1",
        plural="events",
        kind="Event",
        namespaced=True,
        behaviour=CoreEventBehaviour(),
        singular="event",
        short_names=("ev",),
        status_subresource=False,
        allow_create_on_update=True,
        field_getters=_event_getters(),
        merge_schema=METADATA_ONLY_SCHEMA,
        bookmark_body={
            "involvedObject": {},
            "source": {},
            "firstTimestamp": None,
            "lastTimestamp": None,
            "eventTime": None,
            "reportingComponent": "",
            "reportingInstance": "",
        },
    )
    return [
        _pod_type(),
        ResourceType(
            group="",
            version="v1",
            plural="nodes",
            kind="Node",
            namespaced=False,
            behaviour=DEFAULT_BEHAVIOUR,
            singular="node",
            short_names=("no",),
            field_getters=field_getters(False, {"spec.unschedulable": path_getter("spec", "unschedulable")}),
            merge_schema=NODE_SCHEMA,
            bookmark_body={
                "spec": {},
                "status": {"daemonEndpoints": {"kubeletEndpoint": {"Port": 0}}, "nodeInfo": _EMPTY_NODE_INFO},
            },
        ),
        ResourceType(
            group="",
            version="v1",
            plural="namespaces",
            kind="Namespace",
            namespaced=False,
            behaviour=NamespaceBehaviour(),
            singular="namespace",
            short_names=("ns",),
            field_getters=field_getters(False, {"status.phase": path_getter("status", "phase")}),
            merge_schema=NAMESPACE_SCHEMA,
            bookmark_body={"spec": {}, "status": {}},
        ),
        core_events,
        ResourceType(
            group="events.k8s.io",
            version="v1",
            plural="events",
            kind="Event",
            namespaced=True,
            behaviour=EventsV1Behaviour(),
            singular="event",
            short_names=("ev",),
            status_subresource=False,
            allow_create_on_update=True,
            field_getters=core_events.field_getters,
            merge_schema=METADATA_ONLY_SCHEMA,
            bookmark_body=core_event_to_v1(core_events.bookmark_body),
            storage_of=core_events.key,
            view=ViewConversion(to_view=core_event_to_v1, from_view=v1_event_to_core),
        ),
        ResourceType(
            group="coordination.k8s.io",
            version="v1",
            plural="leases",
            kind="Lease",
            namespaced=True,
            behaviour=DEFAULT_BEHAVIOUR,
            singular="lease",
            status_subresource=False,
            field_getters=field_getters(True),
            merge_schema=METADATA_ONLY_SCHEMA,
            bookmark_body={"spec": {}},
        ),
        ResourceType(
            group="policy",
            version="v1",
            plural="poddisruptionbudgets",
            kind="PodDisruptionBudget",
            namespaced=True,
            behaviour=DEFAULT_BEHAVIOUR,
            singular="poddisruptionbudget",
            short_names=("pdb",),
            field_getters=field_getters(True),
            merge_schema=METADATA_ONLY_SCHEMA,
            bookmark_body={"spec": {}, "status": {}},
        ),
        custom_resource_type("scheduling.koordinator.sh", "v1alpha1", "devices", "Device", namespaced=False),
        custom_resource_type(
            "scheduling.koordinator.sh", "v1alpha1", "reservations", "Reservation", namespaced=False
        ),
        custom_resource_type(
            "scheduling.x-k8s.io",
            "v1alpha1",
            "podgroups",
            "PodGroup",
            namespaced=True,
            short_names=("pg", "pgs"),
        ),
    ]


def custom_resource_type(
    group: str,
    version: str,
    plural: str,
    kind: str,
    *,
    namespaced: bool,
    singular: str = "",
    short_names: tuple[str, ...] = (),
    status_subresource: bool = True,
    selectable_fields: tuple[str, ...] = (),
    behaviour: KindBehaviour = DEFAULT_BEHAVIOUR,
) -> ResourceType:
    """A CRD's resource: served like the apiextensions apiserver serves custom resources, pruned by
    the schema of the project's CRD in deploy/crds when there is one."""
    extra = {f: path_getter(*f.split(".")) for f in selectable_fields}
    if behaviour is DEFAULT_BEHAVIOUR:
        schema = crd_schema(plural, group, version)
        if schema is not None:
            behaviour = PrunedCustomResource(schema)
    return ResourceType(
        group=group,
        version=version,
        plural=plural,
        kind=kind,
        namespaced=namespaced,
        behaviour=behaviour,
        singular=singular or kind.lower(),
        short_names=short_names,
        status_subresource=status_subresource,
        custom=True,
        tracks_generation=True,
        field_getters=field_getters(namespaced, extra),
    )


NATIVE_PODGROUP_SCHEMA: Schema = {
    "metadata": _META,
    "spec": {"resourceClaims": MergeList("name")},
    "status": {"conditions": MergeList("type"), "resourceClaimStatuses": MergeList("name")},
}


def native_gang_types(version: str) -> list[ResourceType]:
    """Kubernetes' own gang API, alpha and off by default as on a real server: `v1alpha2` (1.36)
    serves Workloads and PodGroups, `v1alpha1` (1.35) Workloads only (FakeApiServer.serve)."""
    kinds = [("workloads", "Workload", False)] + (
        [("podgroups", "PodGroup", True)] if version == "v1alpha2" else []
    )
    return [
        ResourceType(
            group="scheduling.k8s.io",
            version=version,
            plural=plural,
            kind=kind,
            namespaced=True,
            behaviour=DEFAULT_BEHAVIOUR,
            singular=kind.lower(),
            status_subresource=status,
            field_getters=field_getters(True),
            merge_schema=NATIVE_PODGROUP_SCHEMA if status else METADATA_ONLY_SCHEMA,
            bookmark_body={"spec": {}},
        )
        for plural, kind, status in kinds
    ]


def builtin_registry() -> Registry:
    registry = Registry()
    for rt in builtin_types():
        registry.add(rt)
    return registry
