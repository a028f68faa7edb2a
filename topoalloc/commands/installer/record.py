"""The installation as the cluster records it: the ConfigMap topoalloc-install (the options of the
last install or upgrade), trusted only with the installer's label."""

from __future__ import annotations

from apis.kinds import CONFIGMAPS
from topoalloc.commands.installer.cluster import Cluster
from topoalloc.commands.installer.manifests import MANAGED_BY, MANAGER, NAMESPACE, RECORD, InstallOptions


def recorded_options(cluster: Cluster) -> InstallOptions | None:
    found = cluster.get(CONFIGMAPS.path(RECORD, namespace=NAMESPACE))
    labels = ((found or {}).get("metadata") or {}).get("labels") or {}
    if found is None or labels.get(MANAGED_BY) != MANAGER:
        return None
    return InstallOptions.from_record(found.get("data") or {})
