"""Every Kubernetes resource topoalloc reads or writes, and the one place their API paths are built.

A path is `Kind.path(name, namespace=..., subresource=...)`: `/api/v1/namespaces/ns/pods/p/eviction`
for a core kind, `/apis/<group>/<version>/...` for the others; a kind without a name is its
collection (across all namespaces when no namespace is given). The allocator's client, the agent's
and the installer's take their paths from here, so no module writes an API path by hand
(tests/test_architecture.py holds them to it).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

from apis import device, dra, podgroup, reservation, workload

# The server's version (GET /version): not a resource.
SERVER_VERSION = "/version"


def api_root(api_version: str) -> str:
    """Where the resources of `api_version` live (also their discovery document): /api/v1 for the
    core group, /apis/<group>/<version> for the others."""
    return f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"


def _segment(value: str) -> str:
    return quote(value, safe="")


@dataclass(frozen=True)
class Kind:
    """One resource of the API: its group, version and plural, and whether it is namespaced."""

    name: str  # unique among the kinds watched (metric label, log name)
    group: str  # "" for the core group
    version: str
    plural: str
    # A kind that may not be there for us: looked up through API discovery before every LIST (an
    # alpha API the server serves only when turned on), and a LIST that RBAC forbids is an empty set
    # too, not an outage (an allocator upgraded before its ClusterRole still serves; it just weighs
    # no budgets).
    optional: bool = False
    namespaced: bool = True

    @property
    def custom(self) -> bool:
        return bool(self.group)

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def root(self) -> str:
        """Its group's path (and discovery document)."""
        return api_root(self.group_version)

    def path(self, name: str = "", *, namespace: str = "", subresource: str = "") -> str:
        """The path of one object (`name`), of its `subresource`, or of the collection (no name:
        across all namespaces when no `namespace` is given either)."""
        if namespace and not self.namespaced:
            raise ValueError(f"{self.name} is cluster-scoped: no namespace {namespace!r}")
        if name and self.namespaced and not namespace:
            raise ValueError(f"{self.name} {name!r} needs its namespace")
        if subresource and not name:
            raise ValueError(f"{self.name} subresource {subresource!r} needs an object's name")
        out = self.root
        if namespace:
            out += f"/namespaces/{_segment(namespace)}"
        out += f"/{self.plural}"
        if name:
            out += f"/{_segment(name)}"
        if subresource:
            out += f"/{subresource}"
        return out


# -- watched by the allocator's cache --------------------------------------------------------------
NODES = Kind("Node", "", "v1", "nodes", namespaced=False)
PODS = Kind("Pod", "", "v1", "pods")
DEVICES = Kind(device.KIND, device.GROUP, device.VERSION, device.PLURAL, namespaced=False)
PODGROUPS = Kind("PodGroup", podgroup.GROUP, podgroup.VERSION, podgroup.PLURAL)
# Kubernetes' own gang API: 1.36 serves v1alpha2 PodGroups, 1.35 v1alpha1 Workloads (apis/workload.py).
NATIVE_PODGROUPS = Kind(
    "PodGroup.scheduling.k8s.io", workload.GROUP, workload.V1ALPHA2, workload.PODGROUPS, optional=True
)
WORKLOADS = Kind("Workload", workload.GROUP, workload.V1ALPHA1, workload.WORKLOADS, optional=True)
RESERVATIONS = Kind(
    reservation.KIND, reservation.GROUP, reservation.VERSION, reservation.PLURAL, namespaced=False
)
# DRA (resource.k8s.io/v1): what claims are allocated from and against.
RESOURCECLAIMS = Kind("ResourceClaim", dra.GROUP, dra.VERSION, "resourceclaims")
RESOURCECLAIMTEMPLATES = Kind("ResourceClaimTemplate", dra.GROUP, dra.VERSION, "resourceclaimtemplates")
DEVICECLASSES = Kind("DeviceClass", dra.GROUP, dra.VERSION, "deviceclasses", namespaced=False)
RESOURCESLICES = Kind("ResourceSlice", dra.GROUP, dra.VERSION, "resourceslices", namespaced=False)
DRA_KINDS = (DEVICECLASSES, RESOURCESLICES, RESOURCECLAIMTEMPLATES, RESOURCECLAIMS)
PDBS = Kind("PodDisruptionBudget", "policy", "v1", "poddisruptionbudgets", optional=True)

# -- read or written, not watched ------------------------------------------------------------------
EVENTS = Kind("Event", "events.k8s.io", "v1", "events")
CORE_EVENTS = Kind("Event.v1", "", "v1", "events")  # the agent's (core/v1 Events)
LEASES = Kind("Lease", "coordination.k8s.io", "v1", "leases")
CONFIGMAPS = Kind("ConfigMap", "", "v1", "configmaps")
SECRETS = Kind("Secret", "", "v1", "secrets")
SERVICES = Kind("Service", "", "v1", "services")
NAMESPACES = Kind("Namespace", "", "v1", "namespaces", namespaced=False)
PRIORITYCLASSES = Kind("PriorityClass", "scheduling.k8s.io", "v1", "priorityclasses", namespaced=False)
MUTATING_WEBHOOKS = Kind(
    "MutatingWebhookConfiguration",
    "admissionregistration.k8s.io",
    "v1",
    "mutatingwebhookconfigurations",
    namespaced=False,
)
REPLICASETS = Kind("ReplicaSet", "apps", "v1", "replicasets")
DEPLOYMENTS = Kind("Deployment", "apps", "v1", "deployments")
STATEFULSETS = Kind("StatefulSet", "apps", "v1", "statefulsets")
