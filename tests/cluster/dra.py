"""Nodes in dra mode on the real control plane: the real agent process (fixture mode, its
node-bound identity, `--mode dra`, its DRA plugin on) beside a stand-in DRA kubelet
(tests/support/dra_kubelet.py) that reads claims with the admin client. No pytest here."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from apis import dra
from tests.cluster.harness import ClusterEnv
from tests.support.cluster_product import FIXTURES, agent_argv
from tests.support.controlplane import Process, wait_until
from tests.support.dra_kubelet import DraKubelet

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"
TEMPLATES = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates"


@dataclass
class DraNode:
    name: str
    root: Path  # the node's folders (sockets, CDI specs, checkpoint) and its private fixture copy
    fixture: Path
    kubeconfig: Path  # the agent's node-bound identity
    kubelet: DraKubelet
    agent: Process | None = None
    config: Path | None = None  # the agent's config file, when it has one

    @property
    def cdi(self) -> Path:
        return self.root / "cdi"


def _agent(cluster: ClusterEnv, node: DraNode, generation: int) -> Process:
    argv = agent_argv(
        str(node.fixture),
        node.name,
        node.kubeconfig,
        2,
        "--mode",
        "dra",
        "--dra-plugin",
        "--dra-registry-dir",
        str(node.root / "reg"),
        "--dra-plugin-dir",
        str(node.root / "plugin"),
        "--dra-cdi-root",
        str(node.cdi),
        "--dev-root",
        str(node.root / "dev"),
        "--state-dir",
        str(node.root / "state"),
        *(("--config", str(node.config)) if node.config is not None else ()),
        "-v",
    )
    proc = Process(
        f"agent-{node.name}-{generation}", argv, cluster.workdir / f"agent-{node.name}-{generation}.log"
    )
    cluster.extra.append(proc)
    return proc.start()


def start_dra_node(
    cluster: ClusterEnv,
    name: str,
    fixture: str = "dgx-h100",
    *,
    labels: dict[str, str] | None = None,
    config: dict[str, Any] | None = None,
) -> DraNode:
    """A Node (no device capacity: its devices are in its slices), its stand-in DRA kubelet and its
    agent in dra mode on a private copy of `fixture` (a test may change its sysfs), with `config`
    as its config file when given."""
    root = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))  # unix socket paths must stay short
    (root / "dev").mkdir()
    for dev in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"):
        (root / "dev" / dev).touch()
    copy = root / "fixture"
    shutil.copytree(FIXTURES / fixture, copy, symlinks=True)
    kubelet = DraKubelet(root / "reg", cluster.cp.admin.get).start()
    cluster.cp.create_node(name, labels=labels)
    node = DraNode(name, root, copy, cluster.agent_identity(name), kubelet)
    if config is not None:
        node.config = root / "agent.yaml"
        node.config.write_text(yaml.safe_dump(config))
    node.agent = _agent(cluster, node, 0)
    return node


def restart_agent(cluster: ClusterEnv, node: DraNode, generation: int) -> None:
    """Stop the node's agent and start a new process on the same folders and checkpoint."""
    assert node.agent is not None
    node.agent.stop()
    node.agent = _agent(cluster, node, generation)


def node_slices(cluster: ClusterEnv, node: str) -> list[dict[str, Any]]:
    items = cluster.cp.admin.get(SLICES, fieldSelector=f"spec.nodeName={node}")["items"]
    return sorted(
        (s for s in items if s["spec"]["driver"] == dra.DRIVER), key=lambda s: s["metadata"]["name"]
    )


def wait_slices(
    cluster: ClusterEnv, node: DraNode, predicate: Any = bool, timeout: float = 90.0
) -> list[dict[str, Any]]:
    return wait_until(
        lambda: (s := node_slices(cluster, node.name)) and predicate(s) and s,
        timeout=timeout,
        what=f"ResourceSlices of {node.name}",
        process=node.agent,
    )


def stop_dra_node(cluster: ClusterEnv, node: DraNode) -> None:
    if node.agent is not None:
        node.agent.stop()
    node.kubelet.stop()
    cluster.remove_node(node.name)
    shutil.rmtree(node.root, ignore_errors=True)


@contextmanager
def running_dra_nodes(cluster: ClusterEnv, started: Mapping[str, DraNode]) -> Iterator[dict[str, DraNode]]:
    """The nodes just started, once each publishes its slices and kubelet has registered its
    plugin; stopped on the way out (also when that wait fails)."""
    try:
        for node in started.values():
            wait_slices(cluster, node)
            node.kubelet.wait_registered(dra.DRIVER, timeout=60)
        yield dict(started)
    finally:
        for node in started.values():
            stop_dra_node(cluster, node)
