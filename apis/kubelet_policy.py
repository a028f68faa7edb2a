"""What the agent tells the allocator about kubelet's Topology Manager and CPU manager, on the Node.

kubelet's Topology Manager aligns a container's devices (and, with the static CPU manager, its
exclusive CPUs) on the NUMA node(s) it merges from their hints; it does not read our annotation. So
that kubelet and the allocator land on the same NUMA node, the agent publishes kubelet's policies
and the allocator places devices where kubelet's merge will put them (docs/agent.md, "kubelet's
Topology Manager"). Labels:

* `node.koordinator.sh/numa-topology-policy`: Koordinator's, one of `NUMA_POLICIES` (absent: none);
* `topoalloc.io/topology-manager-scope`: `container` or `pod` (with a policy);
* `topoalloc.io/cpu-manager-policy`: `static` or `none` (with a policy);
* `topoalloc.io/numa-cpus`: with the static CPU manager, per NUMA node its CPUs and those the static
  policy may hand out exclusively (not reserved), `<numa>.<cpus>.<exclusive>` joined by `_`
  (`0.112.110_1.112.112`); left out when it would not fit a label value (63 characters).
"""

from __future__ import annotations

from apis import keys

NUMA_TOPOLOGY_POLICY = keys.NODE + "numa-topology-policy"
TOPOLOGY_MANAGER_SCOPE = keys.TOPOALLOC + "topology-manager-scope"
CPU_MANAGER_POLICY = keys.TOPOALLOC + "cpu-manager-policy"
NUMA_CPUS = keys.TOPOALLOC + "numa-cpus"
LABELS = (NUMA_TOPOLOGY_POLICY, TOPOLOGY_MANAGER_SCOPE, CPU_MANAGER_POLICY, NUMA_CPUS)

# kubelet's topologyManagerPolicy -> Koordinator's label value (apis.annotations.NUMA_POLICIES)
KUBELET_POLICIES = {
    "none": "",
    "best-effort": "BestEffort",
    "restricted": "Restricted",
    "single-numa-node": "SingleNUMANode",
}
SCOPES = ("container", "pod")
CPU_POLICIES = ("none", "static")
MAX_LABEL = 63


def format_numa_cpus(cpus: dict[int, tuple[int, int]]) -> str | None:
    """`{numa: (cpus, exclusive)}` as the label value; None when it does not fit one."""
    text = "_".join(f"{n}.{total}.{free}" for n, (total, free) in sorted(cpus.items()))
    return text if text and len(text) <= MAX_LABEL else None


def parse_numa_cpus(text: str) -> dict[int, tuple[int, int]]:
    """The label value back; {} for a value that is not one (a hand edit: the CPUs are then unknown)."""
    out: dict[int, tuple[int, int]] = {}
    for item in text.split("_") if text else ():
        parts = item.split(".")
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            return {}
        numa, total, free = (int(p) for p in parts)
        if free > total or numa in out:
            return {}
        out[numa] = (total, free)
    return out
