"""The Node labels that tell the allocator how kubelet's Topology Manager and CPU manager will align
a pod (apis/kubelet_policy.py): published only while the agent serves kubelet's device plugins, the
one path on which kubelet aligns our devices (with --no-device-plugin or in dra mode kubelet gets no
NUMA hints for them, and the labels are removed)."""

from __future__ import annotations

from agent.discovery.sysfs import parse_list
from agent.kubelet_config import KubeletPolicies
from apis.kubelet_policy import (
    CPU_MANAGER_POLICY,
    KUBELET_POLICIES,
    LABELS,
    NUMA_CPUS,
    NUMA_TOPOLOGY_POLICY,
    TOPOLOGY_MANAGER_SCOPE,
    format_numa_cpus,
)


def numa_exclusive_cpus(numa_cpus: dict[int, str], policies: KubeletPolicies) -> dict[int, tuple[int, int]]:
    """Per NUMA node: its CPUs and those the static CPU manager may pin (not reserved). Without
    reservedSystemCPUs, kubelet reserves kubeReserved + systemReserved whole CPUs by topology,
    from the first socket: counted here against the lowest NUMA nodes first."""
    reserved = set(policies.reserved_cpus)
    left = policies.reserved_cpu_count
    out: dict[int, tuple[int, int]] = {}
    for numa in sorted(numa_cpus):
        cpus = parse_list(numa_cpus[numa]) or []
        free = len([c for c in cpus if c not in reserved])
        taken = min(left, free)
        left -= taken
        out[numa] = (len(cpus), free - taken)
    return out


def kubelet_labels(
    policies: KubeletPolicies, numa_cpus: dict[int, str], *, serving: bool
) -> dict[str, str | None]:
    """The labels to set (None: remove)."""
    out: dict[str, str | None] = dict.fromkeys(LABELS)
    policy = KUBELET_POLICIES.get(policies.topology_manager_policy, "")
    if not serving or not policy:
        return out
    out[NUMA_TOPOLOGY_POLICY] = policy
    out[TOPOLOGY_MANAGER_SCOPE] = policies.topology_manager_scope
    out[CPU_MANAGER_POLICY] = policies.cpu_manager_policy
    if policies.cpu_manager_policy == "static":
        out[NUMA_CPUS] = format_numa_cpus(numa_exclusive_cpus(numa_cpus, policies))
    return out
