"""Nodes whose real agent serves its device plugins to a stand-in kubelet, and a gang burst from
PodGroup to container on the real control plane; used by `tests/cluster/test_gang_burst.py`
(correctness), `test_gpu_nic_pairs.py`, `test_device_plugin.py` and `bench/gang_burst.py` (timing).
No pytest here.

Each node runs the real agent (fixture mode, its node-bound identity, device plugins on) beside a
stand-in kubelet (`tests/support/kubelet.py`). `BurstKubelets` plays the kubelets' pod sources: one
watch on the namespace hands each pod, as soon as it is seen bound, to its node's admission worker,
which admits it as kubelet does (GetPreferredAllocation, then Allocate). Like kubelet, a node admits
one pod at a time, and the pods that arrived together oldest `creationTimestamp` first; kubelet's
sort is not stable, so same-second pods are admitted in a random order here. Nodes admit in
parallel.
"""

from __future__ import annotations

import contextlib
import json
import queue
import random
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.cluster.gang_sources import SCHEDULER_PLUGINS, GangSource
from tests.cluster.harness import ALLOCATED, DEVICES, ClusterEnv, gpu_pod
from tests.support.cluster_product import agent_argv
from tests.support.controlplane import ControlPlane, Process
from tests.support.kubelet import AdmissionError, Granted, StandInKubelet

PLUGIN_RESOURCES = ["nvidia.com/gpu", "koordinator.sh/gpu-core", "koordinator.sh/gpu", "koordinator.sh/rdma"]


@dataclass
class PluginNode:
    name: str
    root: Path
    kubelet: StandInKubelet
    agent: Process


def start_plugin_node(
    cluster: ClusterEnv,
    name: str,
    *,
    fixture: str = "dgx-h100",
    gpus: int = 8,
    labels: dict[str, str],
    extra_args: tuple[str, ...] = (),
) -> PluginNode:
    """A Node, its stand-in kubelet and its agent serving that kubelet (not waited for: see
    `wait_plugin_node`, so that several nodes start together)."""
    root = Path(tempfile.mkdtemp(prefix="gb-", dir="/tmp"))  # unix socket paths must stay short
    (root / "dev").mkdir()
    for dev in ("nvidiactl", "nvidia-uvm"):
        (root / "dev" / dev).touch()
    kubelet = StandInKubelet(root / "dp", root / "pr.sock").start()
    cluster.add_node(name, fixture, gpus=gpus, labels=labels, agent=False)
    argv = agent_argv(
        fixture,
        name,
        cluster.agent_identity(name),
        5,
        "--device-plugin",
        "--device-plugin-dir",
        str(root / "dp"),
        "--pod-resources-socket",
        str(root / "pr.sock"),
        "--cdi-root",
        str(root / "cdi"),
        "--dev-root",
        str(root / "dev"),
        "--state-dir",
        str(root / "state"),
        *extra_args,
    )
    agent = Process(f"agent-{name}", argv, cluster.workdir / f"agent-{name}.log").start()
    cluster.extra.append(agent)
    return PluginNode(name, root, kubelet, agent)


def wait_plugin_node(cluster: ClusterEnv, node: PluginNode, timeout: float = 120.0) -> None:
    cluster.wait_device(node.name, timeout=timeout)
    node.kubelet.wait_registered(PLUGIN_RESOURCES, timeout=timeout)


def stop_plugin_node(cluster: ClusterEnv, node: PluginNode) -> None:
    node.agent.stop()
    node.kubelet.stop()
    cluster.remove_node(node.name)
    shutil.rmtree(node.root, ignore_errors=True)


def stop_plugin_nodes(cluster: ClusterEnv, nodes: list[PluginNode]) -> None:
    """Several at once: each agent takes a moment to stop."""
    with ThreadPoolExecutor(max(1, len(nodes))) as pool:
        list(pool.map(lambda n: stop_plugin_node(cluster, n), nodes))


def device_ids(cluster: ClusterEnv, node: str, kind: str) -> dict[int, str]:
    """minor -> id (GPU UUID, RDMA PF address) of one kind of device in the node's Device."""
    device = cluster.cp.admin.get(f"{DEVICES}/{node}")
    return {int(d["minor"]): str(d["id"]) for d in device["spec"]["devices"] if d["type"] == kind}


def gpu_uuids(cluster: ClusterEnv, node: str) -> dict[int, str]:
    return device_ids(cluster, node, "gpu")


def create_gang(
    cp: ControlPlane,
    ns: str,
    group: str,
    members: int,
    gpus: int,
    selector: dict[str, str],
    source: GangSource = SCHEDULER_PLUGINS,
) -> float:
    """The gang's object (a PodGroup of `source`'s kind) and its members, POSTed in parallel (a
    burst). Returns when (time.monotonic) the last member was created: from then on the gang is
    complete."""
    source.create(cp, ns, group, members)

    def one(i: int) -> float:
        body = source.join(gpu_pod(f"{group}-{i:02d}", gpus=gpus, node_selector=selector), group)
        cp.admin.post(f"/api/v1/namespaces/{ns}/pods", body)
        return time.monotonic()

    with ThreadPoolExecutor(8) as pool:
        return max(pool.map(one, range(members)))


@dataclass
class PodTimes:
    """What happened to one pod, in time.monotonic seconds."""

    node: str = ""
    ungated: float | None = None  # first seen without scheduling gates
    bound: float | None = None  # first seen bound
    admitted: float | None = None  # its last Allocate answered
    pod: dict[str, Any] = field(default_factory=dict)  # as first seen bound (the allocator's annotation)
    granted: dict[str, dict[str, Granted]] = field(default_factory=dict)
    error: str = ""


class BurstKubelets:
    """The kubelets of `nodes` admitting the pods of `namespace` as they bind."""

    def __init__(self, cp: ControlPlane, namespace: str, nodes: dict[str, StandInKubelet]) -> None:
        self.cp = cp
        self.namespace = namespace
        self.nodes = nodes
        self.pods: dict[str, PodTimes] = {}
        self._changed = threading.Condition()
        self._queues: dict[str, queue.Queue[dict[str, Any] | None]] = {n: queue.Queue() for n in nodes}
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._admit, args=(n,), name=f"kubelet-{n}", daemon=True) for n in nodes
        ]
        for t in self._threads:
            t.start()
        cp.watch_pods(namespace, self._event, self._stop, "burst-watch")

    # -- the pod source ----------------------------------------------------------------------
    def _event(self, event: dict[str, Any]) -> None:
        now = time.monotonic()
        obj = event.get("object") or {}
        meta = obj.get("metadata") or {}
        if event.get("type") not in ("ADDED", "MODIFIED") or not meta.get("name"):
            return
        spec = obj.get("spec") or {}
        with self._changed:
            times = self.pods.setdefault(meta["name"], PodTimes())
            if times.ungated is None and not spec.get("schedulingGates"):
                times.ungated = now
            node = spec.get("nodeName")
            if times.bound is None and node:
                times.bound, times.node, times.pod = now, node, obj
                if node in self._queues:
                    self._queues[node].put(obj)
            self._changed.notify_all()

    # -- a node's admissions -----------------------------------------------------------------
    def _admit(self, node: str) -> None:
        kubelet = self.nodes[node]
        source = self._queues[node]
        stopping = False
        while not stopping and (first := source.get()) is not None:
            batch = [first]
            with contextlib.suppress(queue.Empty):
                while (more := source.get_nowait()) is not None:
                    batch.append(more)
                stopping = True
            random.shuffle(batch)  # then a stable sort: ties in a random order, as kubelet's unstable one
            batch.sort(key=lambda p: str(p["metadata"].get("creationTimestamp", "")))
            for pod in batch:
                name = pod["metadata"]["name"]
                try:
                    granted, error = kubelet.admit(pod), ""
                except AdmissionError as exc:
                    granted, error = {}, str(exc)
                with self._changed:
                    times = self.pods[name]
                    times.admitted, times.granted, times.error = time.monotonic(), granted, error
                    self._changed.notify_all()

    def wait_admitted(self, count: int, timeout: float) -> dict[str, PodTimes]:
        """Until `count` pods were admitted or refused; raises TimeoutError with what is missing."""
        with self._changed:
            done = lambda: sum(1 for t in self.pods.values() if t.admitted is not None) >= count  # noqa: E731
            if not self._changed.wait_for(done, timeout):
                bound = sum(1 for t in self.pods.values() if t.bound is not None)
                admitted = sum(1 for t in self.pods.values() if t.admitted is not None)
                raise TimeoutError(
                    f"after {timeout:.0f}s: {len(self.pods)} pods seen, {bound} bound, {admitted} admitted"
                )
            return dict(self.pods)

    def close(self) -> None:
        self._stop.set()
        for q in self._queues.values():
            q.put(None)
        for t in self._threads:
            t.join(10)


def annotated_gpus(pod: dict[str, Any], uuids: dict[int, str]) -> list[str]:
    """The GPU UUIDs of the pod's device-allocated annotation (by minor, through the Device)."""
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(ALLOCATED)
    if not raw:
        return []
    return sorted(uuids[int(g["minor"])] for g in json.loads(raw).get("gpu") or [])


@dataclass
class Verdict:
    """How the admitted gang's devices compare with the allocator's annotations."""

    refused: list[str] = field(default_factory=list)  # pod: kubelet's admission error
    foreign: list[str] = field(default_factory=list)  # a GPU the allocator did not give any pod of the node
    doubled: list[str] = field(default_factory=list)  # a GPU handed to two containers of a node
    differs: list[str] = field(default_factory=list)  # a container's GPUs are not its pod's annotated ones

    @property
    def bad(self) -> list[str]:
        return self.refused + self.foreign + self.doubled + self.differs


def judge(times: dict[str, PodTimes], uuids: dict[str, dict[int, str]]) -> Verdict:
    verdict = Verdict()
    granted: dict[str, list[str]] = {}  # node -> every GPU kubelet handed out
    annotated: dict[str, set[str]] = {}  # node -> every GPU the allocator gave its pods
    for name, t in sorted(times.items()):
        if t.error or t.bound is None:
            verdict.refused.append(f"{name}: {t.error or 'never bound'}")
            continue
        want = annotated_gpus(t.pod, uuids[t.node])
        got = sorted(t.granted["main"]["nvidia.com/gpu"].ids)
        granted.setdefault(t.node, []).extend(got)
        annotated.setdefault(t.node, set()).update(want)
        if got != want:
            verdict.differs.append(f"{name} on {t.node}: got {got}, annotated {want}")
    for node, ids in granted.items():
        verdict.doubled += [f"{node}: {i} twice" for i in sorted({i for i in ids if ids.count(i) > 1})]
        verdict.foreign += [f"{node}: {i} not annotated" for i in sorted(set(ids) - annotated[node])]
    return verdict


CROSSCHECK_SETTLE_SECONDS = 4.0  # the agents' cross-check runs 2 s after a served Allocate


def rewritten_annotations(cp: ControlPlane, ns: str, times: dict[str, PodTimes]) -> list[str]:
    """Pods whose `device-allocated` annotation is no longer the one the allocator wrote at bind (the
    agent's PodResources cross-check rewrites an annotation that differs from kubelet's truth),
    read once the cross-check has had its time after the last admission."""
    time.sleep(CROSSCHECK_SETTLE_SECONDS)
    pods = {p["metadata"]["name"]: p for p in cp.admin.get(f"/api/v1/namespaces/{ns}/pods")["items"]}
    out = []
    for name, t in sorted(times.items()):
        now = ((pods.get(name) or {}).get("metadata") or {}).get("annotations") or {}
        then = (t.pod.get("metadata") or {}).get("annotations") or {}
        if now.get(ALLOCATED) != then.get(ALLOCATED):
            out.append(name)
    return out
