"""Settings of scarce-resource avoidance for every pod (the `scarceAvoidance:` block of the
allocator's config, docs/service.md "CPU-only pods and GPU nodes")."""

from __future__ import annotations

from dataclasses import dataclass, field

# Labels that mark a node with scarce devices: the agent's (and koordlet's) GPU vendor label, and the
# three labels daemonset/daemonset.yaml selects GPU nodes by (GPU Feature Discovery, Node Feature
# Discovery's PCI vendor 10de, `topoalloc install --gpu-nodes`). A node carrying none is preferred.
DEFAULT_NODE_LABELS = (
    "node.koordinator.sh/gpu-vendor",
    "nvidia.com/gpu.present",
    "feature.node.kubernetes.io/pci-10de.present",
    "topoalloc.io/gpu-node",
)

WEIGHT_RANGE = (1, 100)  # the preferred term's weight, as kube-scheduler accepts it


@dataclass
class ScarceAvoidanceSettings:
    # Serve the admission route that gives pods requesting no device a preferred node affinity
    # away from scarce-device nodes (the webhook entry scarce-avoidance.topoalloc.io calls it).
    enabled: bool = True
    # The preferred term's weight (1-100), against the pod's own preferred terms: kube-scheduler's
    # NodeAffinity score adds the weights of the terms a node matches.
    weight: int = 50
    node_labels: list[str] = field(default_factory=lambda: list(DEFAULT_NODE_LABELS))
    # Only pods for these schedulers are given the preference; empty means every pod.
    scheduler_names: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not WEIGHT_RANGE[0] <= self.weight <= WEIGHT_RANGE[1]:
            raise ValueError(f"scarceAvoidance.weight: expected 1 to 100, got {self.weight}")
        if self.enabled and not self.node_labels:
            raise ValueError("scarceAvoidance.nodeLabels: name at least one label (or set enabled: false)")
