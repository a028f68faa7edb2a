"""Where the agent DaemonSet will run, and which of those nodes another device plugin serves.

Pure: Nodes, DaemonSets and Pods in, sentences out. The agent's nodes are found by the rendered
DaemonSet's own node affinity and tolerations (plus the tolerations the DaemonSet controller adds
to every daemon pod), so the report cannot drift from the manifest.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from apis.node_selector import requirements, term_matches
from apis.resources import NVIDIA_GPU
from apis.tolerations import BLOCKING, tolerates

Obj = Mapping[str, Any]
GFD_LABEL = "nvidia.com/gpu.present"
NFD_LABEL = "feature.node.kubernetes.io/pci-10de.present"
AGENT = "topoalloc-agent"
# What the DaemonSet controller tolerates for every daemon pod, besides the pod's own tolerations.
DAEMON_TOLERATIONS = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/network-unavailable", "operator": "Exists", "effect": "NoSchedule"},
)


@dataclass
class Placement:
    """The agent's nodes (name -> the label that selects it), the others (name -> why not), and
    nodes that advertise GPUs without any of the labels (candidates for --gpu-nodes)."""

    agent: dict[str, str] = field(default_factory=dict)
    other: dict[str, str] = field(default_factory=dict)
    unlabelled_gpu_nodes: list[str] = field(default_factory=list)


def _labels(obj: Obj) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


def _name(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def selecting_term(labels: Mapping[str, str], terms: Sequence[Obj], name: str = "") -> str | None:
    """The first nodeSelectorTerm the node (`labels`, `name`) satisfies, said as its first
    requirement's key; matched as the allocator and kube-scheduler match them (apis/node_selector.py)."""
    for term in terms:
        expressions = requirements(term.get("matchExpressions") or [])
        fields = requirements(term.get("matchFields") or [])
        if term_matches(expressions, fields, labels, name):
            return (expressions or fields)[0][0]
    return None


def agent_placement(
    nodes: Sequence[Obj], daemonset: Obj, extra_labels: Mapping[str, Mapping[str, str]]
) -> Placement:
    """Which nodes the DaemonSet runs on, with `extra_labels` (node -> labels the installer is about
    to add) counted as there."""
    spec = daemonset["spec"]["template"]["spec"]
    terms = (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        or {}
    ).get("nodeSelectorTerms") or []
    tolerations = [*(spec.get("tolerations") or []), *DAEMON_TOLERATIONS]
    placement = Placement()
    for node in nodes:
        name = _name(node)
        labels = {**_labels(node), **extra_labels.get(name, {})}
        term = selecting_term(labels, terms, name) if terms else "(no node affinity)"
        hard = [
            t
            for t in (node.get("spec") or {}).get("taints") or []
            if isinstance(t, dict) and t.get("effect") in BLOCKING and not tolerates(tolerations, t)
        ]
        if term is None:
            placement.other[name] = "none of the GPU labels"
            if _advertises_gpus(node):
                placement.unlabelled_gpu_nodes.append(name)
        elif hard:
            placement.other[name] = f"taint {hard[0].get('key')}:{hard[0].get('effect')} is not tolerated"
        else:
            placement.agent[name] = term
    return placement


def _advertises_gpus(node: Obj) -> bool:
    capacity = (node.get("status") or {}).get("capacity") or {}
    return str(capacity.get(NVIDIA_GPU, "0")) not in ("", "0")


def device_plugin_conflicts(
    agent_nodes: Iterable[str], nodes: Sequence[Obj], daemonsets: Sequence[Obj], pods: Sequence[Obj]
) -> list[str]:
    """A sentence per agent node that another device plugin serves: a pod of an NVIDIA device
    plugin DaemonSet (`nvidia-device-plugin*`, the GPU Operator's included) runs there, or the node
    advertises nvidia.com/gpu while no topoalloc agent pod runs there. Two plugins registering
    nvidia.com/gpu with one kubelet hand a container GPUs the allocator did not choose."""
    wanted = set(agent_nodes)
    plugin_sets = {
        (str(d["metadata"].get("namespace", "")), _name(d)): d
        for d in daemonsets
        if "nvidia-device-plugin" in _name(d)
    }
    serving: dict[str, str] = {}
    agents: set[str] = set()
    for pod in pods:
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        meta = pod.get("metadata") or {}
        if not node:
            continue
        for owner in meta.get("ownerReferences") or []:
            if owner.get("kind") != "DaemonSet":
                continue
            key = (str(meta.get("namespace", "")), str(owner.get("name", "")))
            if key in plugin_sets:
                serving.setdefault(node, f"{key[0]}/{key[1]}")
            elif key[1] == AGENT:
                agents.add(node)
    out = []
    for node in nodes:
        name = _name(node)
        if name not in wanted:
            continue
        if name in serving:
            out.append(
                f"node {name}: the NVIDIA device plugin (DaemonSet {serving[name]}) runs there; turn it off "
                "on the agent's nodes (GPU Operator: label the node "
                "nvidia.com/gpu.deploy.device-plugin=false)"
            )
        elif _advertises_gpus(node) and name not in agents:
            out.append(
                f"node {name} advertises {NVIDIA_GPU} and no topoalloc agent runs there: another device "
                "plugin serves it; turn it off on the agent's nodes"
            )
    return out
