"""Where the agent DaemonSet runs and which of those nodes another device plugin serves, from the
rendered DaemonSet itself."""

from __future__ import annotations

from typing import Any

from topoalloc.commands.installer.manifests import ClusterFacts, InstallOptions, render
from topoalloc.commands.installer.nodes import agent_placement, device_plugin_conflicts

Doc = dict[str, Any]
DAEMONSET = next(
    d
    for d in render(InstallOptions(version="1", scheduler_version="v1.35.6"), ClusterFacts())
    if d["kind"] == "DaemonSet"
)


def node(
    name: str, labels: dict[str, str] | None = None, gpus: int = 0, taints: list[Doc] | None = None
) -> Doc:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"taints": taints or []},
        "status": {"capacity": {"nvidia.com/gpu": str(gpus)} if gpus else {}},
    }


def pod(name: str, node_name: str, namespace: str, owner: str) -> Doc:
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "ownerReferences": [{"kind": "DaemonSet", "name": owner}],
        },
        "spec": {"nodeName": node_name},
    }


NODES = [
    node("gfd", {"nvidia.com/gpu.present": "true"}, gpus=8),
    node("nfd", {"feature.node.kubernetes.io/pci-10de.present": "true"}, gpus=4),
    node("bare-gpu", gpus=8),
    node("cpu"),
    node(
        "tainted", {"nvidia.com/gpu.present": "true"}, taints=[{"key": "maintenance", "effect": "NoExecute"}]
    ),
    node(
        "cordoned",
        {"nvidia.com/gpu.present": "true"},
        taints=[{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}],
    ),
]


def test_the_agent_goes_where_the_daemonsets_affinity_and_tolerations_say() -> None:
    placement = agent_placement(NODES, DAEMONSET, {})
    assert placement.agent == {
        "gfd": "nvidia.com/gpu.present",
        "nfd": "feature.node.kubernetes.io/pci-10de.present",
        "cordoned": "nvidia.com/gpu.present",  # the agent tolerates every NoSchedule taint
    }
    assert placement.other["tainted"] == "taint maintenance:NoExecute is not tolerated"
    assert placement.other["cpu"] == "none of the GPU labels"
    assert placement.unlabelled_gpu_nodes == ["bare-gpu"]


def test_the_label_about_to_be_added_counts() -> None:
    placement = agent_placement(NODES, DAEMONSET, {"bare-gpu": {"topoalloc.io/gpu-node": "true"}})
    assert placement.agent["bare-gpu"] == "topoalloc.io/gpu-node" and not placement.unlabelled_gpu_nodes


def test_device_plugin_conflicts_on_the_agents_nodes_only() -> None:
    daemonsets = [
        {"metadata": {"name": "nvidia-device-plugin-daemonset", "namespace": "gpu-operator"}},
        {"metadata": {"name": "topoalloc-agent", "namespace": "topoalloc-system"}},
    ]
    pods = [
        pod("p1", "gfd", "gpu-operator", "nvidia-device-plugin-daemonset"),
        pod("p2", "cpu", "gpu-operator", "nvidia-device-plugin-daemonset"),
        pod("a1", "nfd", "topoalloc-system", "topoalloc-agent"),
    ]
    lines = device_plugin_conflicts(["gfd", "nfd", "bare-gpu"], NODES, daemonsets, pods)
    assert lines[0].startswith(
        "node gfd: the NVIDIA device plugin (DaemonSet gpu-operator/nvidia-device-plugin-daemonset)"
    )
    # bare-gpu advertises nvidia.com/gpu with no agent there: some other plugin serves it.
    assert lines[1].startswith("node bare-gpu advertises nvidia.com/gpu and no topoalloc agent runs there")
    assert len(lines) == 2  # nfd: ours serves it; cpu: no agent wanted there


def test_node_affinity_and_taints_read_as_the_allocator_reads_them() -> None:
    """The same term matching as kube-scheduler and the allocator (apis/node_selector.py): a term's
    matchFields name a node, Gt compares integers; and the same toleration matching (apis/tolerations.py)."""
    spec = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["cpu"]}]},
                        {"matchExpressions": [{"key": "gpus", "operator": "Gt", "values": ["4"]}]},
                    ]
                }
            }
        },
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
    }
    daemonset = {"spec": {"template": {"spec": spec}}}
    nodes = [
        node("cpu"),
        node("eight", {"gpus": "8"}, taints=[{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]),
        node("four", {"gpus": "4"}),
        node("other", {"gpus": "8"}, taints=[{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]),
    ]
    placement = agent_placement(nodes, daemonset, {})
    assert placement.agent == {"cpu": "metadata.name", "eight": "gpus"}
    assert placement.other == {
        "four": "none of the GPU labels",
        "other": "taint dedicated:NoSchedule is not tolerated",
    }
