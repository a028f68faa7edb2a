"""Placement mode on the real-cluster tier, for the modules that test it (no pytest here): kube-scheduler
restarted with an empty configuration (no extender, no second scheduler), deploy/'s webhook
configuration (the placement route, gang webhooks failing closed), every allocator replica started
with --placement; and back to the tier's extender mode after. Plus what kubelet would write into a
plugin node's status, which the stand-in kubelet does not."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import yaml

from tests.cluster.burst import PLUGIN_RESOURCES, PluginNode, start_plugin_node, stop_plugin_node
from tests.cluster.harness import ClusterEnv, allocated, webhook_configuration

GATE = "topoalloc.io/placement"
ALLOCATED_NODE = "topoalloc.io/allocated-node"


def _webhooks(cluster: ClusterEnv, placement: bool) -> None:
    config = webhook_configuration(
        f"https://127.0.0.1:{cluster.webhook.port}",
        (cluster.certs / "ca.crt").read_bytes(),
        placement=placement,
    )
    cluster.cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(config))


def set_placement_mode(cluster: ClusterEnv, on: bool) -> None:
    """Every replica, kube-scheduler and the webhooks in placement mode (or back to the tier's)."""
    cluster.placement = on
    cluster.cp.start_scheduler(cluster.scheduler_configuration())
    _webhooks(cluster, on)
    live = sorted(i for i, r in cluster.replicas.items() if r.process.alive())
    for identity in sorted(set(live) | {"alloc-a"}):
        cluster.start_allocator(identity, extra_args=cluster.allocator_args()).wait_ready()
    if not on:
        cluster.replicas["alloc-a"].wait_ready("/readyz")  # leading again, as the tier expects


@contextmanager
def placement_mode(
    cluster: ClusterEnv, node_names: tuple[str, ...], labels: dict[str, str] | None = None
) -> Iterator[dict[str, PluginNode]]:
    """The cluster in placement mode with these plugin nodes (agent + stand-in kubelet each, their
    capacity written as kubelet would); the tier's state back after: alloc-a alone and leading."""
    set_placement_mode(cluster, True)
    started = {name: start_plugin_node(cluster, name, labels=labels or {}) for name in node_names}
    try:
        for node in started.values():
            cluster.wait_device(node.name)
            node.kubelet.wait_registered(PLUGIN_RESOURCES, timeout=60)
            kubelet_capacity(cluster, node)
        yield started
    finally:
        for node in started.values():
            stop_plugin_node(cluster, node)
        for identity, replica in cluster.replicas.items():
            if identity != "alloc-a":
                replica.process.stop()
        set_placement_mode(cluster, False)


def kubelet_capacity(cluster: ClusterEnv, node: PluginNode) -> None:
    """What kubelet writes into the Node's status for its device plugins: each resource's healthy
    device count (the stand-in kubelet serves the plugins but writes no Node status)."""
    counts = {
        resource: str(sum(1 for health, _numa in plugin.devices.values() if health == "Healthy"))
        for resource, plugin in node.kubelet.plugins.items()
    }
    path = f"/api/v1/nodes/{node.name}/status"
    got = cluster.cp.admin.get(f"/api/v1/nodes/{node.name}")["status"]
    body = {
        "status": {"capacity": {**got["capacity"], **counts}, "allocatable": {**got["allocatable"], **counts}}
    }
    cluster.cp.admin.merge_patch(path, body)


def recorded(pod: dict[str, Any]) -> tuple[str, list[int]]:
    """The node a pod's allocation was made for and its GPU minors."""
    annotations = pod["metadata"].get("annotations") or {}
    return annotations.get(ALLOCATED_NODE, ""), sorted(e["minor"] for e in allocated(pod).get("gpu", []))
