"""The real-cluster tier's world: one control plane per session (etcd, kube-apiserver,
kube-scheduler with the project's extender configuration, kube-controller-manager), the project's
manifests applied with kubectl, the allocator running as its own ServiceAccount, and helpers for
nodes, agents, pods and waits."""

from __future__ import annotations

import base64
import contextlib
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from allocator.runtime.admission_settings import LEADER_SERVICE
from tests.support.cluster_product import (
    SYSTEM_NAMESPACE,
    AgentProcess,
    AllocatorReplica,
    Forwarder,
    lease_holder,
    make_certs,
    scheduler_config,
    service_account_token,
)
from tests.support.controlplane import REPO, ApiStatus, ControlPlane, ControlPlaneError, Process, wait_until
from tests.support.kube_releases import DEFAULT, KubeRelease
from topoalloc.commands.installer.kustomize import build

ALLOCATED = "scheduling.koordinator.sh/device-allocated"
AGENT_SA = "topoalloc-agent"
ALLOCATOR_SA = "topoalloc-allocator"
DEVICES = "/apis/scheduling.koordinator.sh/v1alpha1/devices"


def webhook_configuration(
    url: str, ca_pem: bytes, *, placement: bool = False, leader_url: str = ""
) -> dict[str, Any]:
    """The MutatingWebhookConfiguration of deploy/ (placement mode) or deploy/extender (the tier's
    extender mode) as kustomize renders it, calling `url` (the forwarder in front of the replicas)
    instead of the in-cluster Service, and `leader_url` (the forwarder in front of the leader alone)
    instead of the leader-only Service (the placement webhook's)."""
    docs = build(REPO / "deploy" / ("" if placement else "extender"))
    config = next(d for d in docs if d and d["kind"] == "MutatingWebhookConfiguration")
    for hook in config["webhooks"]:
        service = hook["clientConfig"]["service"]
        path = service.get("path", "/")
        base = leader_url if leader_url and service["name"] == LEADER_SERVICE else url
        hook["clientConfig"] = {"url": base + path, "caBundle": base64.b64encode(ca_pem).decode()}
    return config


@dataclass
class ClusterEnv:
    workdir: Path
    release: KubeRelease = DEFAULT
    cp: ControlPlane = field(init=False)
    certs: Path = field(init=False)
    replicas: dict[str, AllocatorReplica] = field(default_factory=dict)
    agents: list[AgentProcess] = field(default_factory=list)
    extra: list[Process] = field(default_factory=list)
    # Every topoalloc process ever started, so that stop() ends them all, whatever the tests did.
    started: list[Process] = field(default_factory=list)
    # How kube-scheduler and the allocator run now: placement mode (tests/cluster/placement_mode.py)
    # or the tier's extender mode; with kube-scheduler's GangScheduling plugin or without it.
    placement: bool = False
    gang_plugin: bool = True

    # -- set-up -----------------------------------------------------------------------------------

    def start(self) -> None:
        self.certs = make_certs(self.workdir / "extender-pki")
        # The Services in front of the allocator: the extender reaches the Lease holder only, the
        # admission webhook any live replica.
        self.extender = Forwarder(self._leader_port)
        self.webhook = Forwarder(self._any_webhook_port)
        self.leader_webhook = Forwarder(self._leader_webhook_port)  # the leader-only Service's
        self.cp = ControlPlane(
            self.workdir / "k8s",
            scheduler_config=scheduler_config(f"https://127.0.0.1:{self.extender.port}", self.certs),
            controller_manager=True,
            release=self.release,
            # The native gang API's alpha gates, on for the whole tier: every test passes with them.
            feature_gates=self.release.feature_gates,
            runtime_config=self.release.runtime_config,
        )
        self.cp.start()
        self.apply_manifests()
        self.start_allocator("alloc-a").wait_ready("/readyz")

    def leader(self) -> AllocatorReplica:
        """The replica holding the Lease (and alive)."""
        holder = lease_holder(self.cp)
        replica = self.replicas.get(holder or "")
        assert replica is not None and replica.process.alive(), f"no live leader (Lease holder {holder!r})"
        return replica

    def _leader_port(self) -> int | None:
        holder = lease_holder(self.cp)
        replica = self.replicas.get(holder or "")
        return replica.port if replica and replica.process.alive() else None

    def _leader_webhook_port(self) -> int | None:
        holder = lease_holder(self.cp)
        replica = self.replicas.get(holder or "")
        return replica.webhook_port if replica and replica.process.alive() else None

    def _any_webhook_port(self) -> int | None:
        for replica in self.replicas.values():
            if replica.process.alive():
                return replica.webhook_port
        return None

    def apply_manifests(self) -> None:
        kubectl = self.cp.kubectl
        kubectl("apply", "-k", str(REPO / "deploy" / "crds"))
        kubectl("wait", "--for=condition=Established", "--timeout=120s", "crd", "--all")
        kubectl("apply", "-k", str(REPO / "deploy" / "dra"))  # the DRA driver's DeviceClasses
        for path in ("namespace.yaml", "serviceaccount.yaml", "rbac.yaml", "admission-policy.yaml"):
            kubectl("apply", "-f", str(REPO / "daemonset" / path))
        for path in ("namespace.yaml", "rbac.yaml"):
            kubectl("apply", "-f", str(REPO / "deploy" / "allocator" / path))
        config = webhook_configuration(
            f"https://127.0.0.1:{self.webhook.port}",
            (self.certs / "ca.crt").read_bytes(),
            leader_url=f"https://127.0.0.1:{self.leader_webhook.port}",
        )
        kubectl("apply", "-f", "-", input=yaml.safe_dump(config))

    def start_allocator(self, identity: str, **kwargs: Any) -> AllocatorReplica:
        """A replica running as the allocator's ServiceAccount (deploy/allocator/rbac.yaml)."""
        previous = self.replicas.get(identity)
        if previous is not None:  # never leave a process running untracked
            previous.process.stop()
        token = service_account_token(self.cp, SYSTEM_NAMESPACE, ALLOCATOR_SA)
        kubeconfig = self.cp.write_kubeconfig(f"allocator-{identity}", token=token)
        replica = AllocatorReplica(kubeconfig, self.certs, self.workdir, identity, **kwargs).start()
        self.replicas[identity] = replica
        self.started.append(replica.process)
        return replica

    def kube_scheduler_gang_plugin(self, on: bool) -> None:
        """Restart kube-scheduler with its GangScheduling plugin (the default profile's, with the
        gates on) or without it, and the allocator to match (`--gang-plugin-schedulers ""`: it
        gates Kubernetes' own gangs itself), in the mode the tier is in."""
        self.gang_plugin = on
        self.cp.start_scheduler(self.scheduler_configuration())
        self.start_allocator("alloc-a", extra_args=self.allocator_args()).wait_ready("/readyz")

    def scheduler_configuration(self) -> dict[str, Any]:
        """kube-scheduler's configuration for the mode the tier is in: the extender's, or (placement
        mode) none of topoalloc's; without the GangScheduling plugin where it is off."""
        config: dict[str, Any] = (
            {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration"}
            if self.placement
            else scheduler_config(f"https://127.0.0.1:{self.extender.port}", self.certs)
        )
        if not self.gang_plugin:
            disabled = {"multiPoint": {"disabled": [{"name": "GangScheduling"}]}}
            config["profiles"] = [{"schedulerName": "default-scheduler", "plugins": disabled}]
        return config

    def allocator_args(self) -> tuple[str, ...]:
        """The allocator's flags for the mode the tier is in."""
        args = ("--placement",) if self.placement else ()
        return args + (() if self.gang_plugin else ("--gang-plugin-schedulers", ""))

    def use_round_trips(self, round_trips: int | None) -> None:
        """kube-scheduler and every allocator replica restarted in that extender mode (None: the
        tier's, TOPOALLOC_ROUND_TRIPS or deploy/'s): standbys first, the leader last, so whoever
        takes the Lease runs the new mode; one of them leads before this returns."""
        self.restart_allocators(round_trips)
        url = f"https://127.0.0.1:{self.extender.port}"
        self.cp.start_scheduler(scheduler_config(url, self.certs, round_trips))

    def restart_allocators(self, round_trips: int | None = None) -> None:
        """Every live allocator replica restarted (standbys first, the leader last), so nothing it
        learned in memory (the scorer's workload mix, the gangs' room) carries over; one of them
        leads before this returns."""
        holder = lease_holder(self.cp)
        live = [i for i, r in self.replicas.items() if r.process.alive()] or ["alloc-a"]
        for identity in sorted(live, key=lambda i: i == holder):
            self.start_allocator(identity, round_trips=round_trips).wait_ready()
        wait_until(
            lambda: (r := self.replicas.get(lease_holder(self.cp) or "")) and r.health("/readyz")[0] == 200,
            timeout=120,
            what=f"an allocator leading with --round-trips {round_trips}",
        )

    def stop(self) -> None:
        for agent in self.agents:
            agent.process.stop()
        for replica in self.replicas.values():
            replica.process.stop()
        for proc in self.extra + self.started:
            proc.stop()
        with contextlib.suppress(AttributeError):
            self.extender.close()
            self.webhook.close()
            self.leader_webhook.close()
        with contextlib.suppress(AttributeError):
            self.cp.stop()

    def processes(self) -> list[Process]:
        procs = list(self.cp.processes.values()) if hasattr(self, "cp") else []
        procs += [r.process for r in self.replicas.values()]
        procs += [a.process for a in self.agents] + self.extra
        return procs

    # -- nodes and agents -------------------------------------------------------------------------

    def agent_identity(self, node: str) -> Path:
        """A kubeconfig with the agent's ServiceAccount token bound to a pod on `node`: what the
        DaemonSet pod's projected token is (it carries the node name the policy checks)."""
        pod = self.cp.admin.post(
            f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods",
            {
                "metadata": {"name": f"agent-{node}", "labels": {"app": "topoalloc-agent-test"}},
                "spec": {
                    "nodeName": node,
                    "serviceAccountName": AGENT_SA,
                    "containers": [{"name": "agent", "image": "topoalloc:test"}],
                },
            },
        )
        token = service_account_token(self.cp, SYSTEM_NAMESPACE, AGENT_SA, bound_pod=pod)
        return self.cp.write_kubeconfig(f"agent-{node}", token=token)

    def add_node(
        self,
        name: str,
        fixture: str,
        *,
        gpus: int,
        labels: dict[str, str] | None = None,
        agent: bool = True,
    ) -> AgentProcess | None:
        """A Node registered with `gpus` nvidia.com/gpu, and (by default) its long-running agent
        publishing `fixture` under the agent's own node-bound identity."""
        capacity = {"nvidia.com/gpu": str(gpus)} if gpus else {}
        self.cp.create_node(name, capacity=capacity, labels=labels)
        if not agent:
            return None
        proc = AgentProcess(fixture, name, self.agent_identity(name), self.workdir).start()
        self.agents.append(proc)
        self.started.append(proc.process)
        return proc

    def wait_device(self, node: str, timeout: float = 90.0) -> dict[str, Any]:
        agent = next((a.process for a in self.agents if a.node == node), None)
        # The agent creates the Device, then writes its status: wait for both.
        return wait_until(
            lambda: (d := self.cp.admin.get(f"{DEVICES}/{node}")).get("status") and d,
            timeout=timeout,
            what=f"Device {node} with its status",
            process=agent,
        )

    def remove_node(self, name: str) -> None:
        for agent in [a for a in self.agents if a.node == name]:
            agent.process.stop()
            self.agents.remove(agent)
        for path in (
            f"{DEVICES}/{name}",
            f"/api/v1/nodes/{name}",
            f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods/agent-{name}",
        ):
            with contextlib.suppress(ApiStatus):
                self.cp.admin.delete(path, gracePeriodSeconds=0)

    # -- pods -------------------------------------------------------------------------------------

    def pod(self, ns: str, name: str) -> dict[str, Any]:
        return self.cp.admin.get(f"/api/v1/namespaces/{ns}/pods/{name}")

    def finish_terminating(self, ns: str, names: Iterable[str], evicted: set[str]) -> None:
        """Kubelet's part for the named pods (no kubelet runs here): one being deleted (evicted)
        goes at once, and its name is added to `evicted`; pods already gone are skipped."""
        for name in names:
            try:
                pod = self.pod(ns, name)
            except ApiStatus:
                continue
            if pod["metadata"].get("deletionTimestamp"):
                evicted.add(name)
                self.cp.admin.delete(f"/api/v1/namespaces/{ns}/pods/{name}", gracePeriodSeconds=0)

    def create_pod(self, ns: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.cp.admin.post(f"/api/v1/namespaces/{ns}/pods", body)

    def wait_bound(self, ns: str, name: str, timeout: float = 60.0) -> dict[str, Any]:
        try:
            return wait_until(
                lambda: (p := self.pod(ns, name))["spec"].get("nodeName") and p,
                timeout=timeout,
                what=f"pod {ns}/{name} bound",
            )
        except ControlPlaneError as exc:
            raise ControlPlaneError(f"{exc}; its conditions: {self.conditions(ns, name)}") from None

    def conditions(self, ns: str, name: str) -> list[Any]:
        try:
            return list((self.pod(ns, name).get("status") or {}).get("conditions") or [])
        except ApiStatus as exc:
            return [str(exc)]

    def wait_pending_reason(self, ns: str, name: str, pattern: str, timeout: float = 60.0) -> str:
        """Until the pod's PodScheduled=False condition message matches `pattern`; returns it."""

        def reason() -> str | None:
            pod = self.pod(ns, name)
            assert not pod["spec"].get("nodeName"), f"{name} was bound to {pod['spec']['nodeName']}"
            for cond in (pod.get("status") or {}).get("conditions") or []:
                if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                    message = str(cond.get("message", ""))
                    if re.search(pattern, message):
                        return message
            return None

        return wait_until(reason, timeout=timeout, what=f"pod {ns}/{name} pending with /{pattern}/")

    def delete_pods(self, ns: str) -> None:
        """Without kubelet a graceful delete never finishes: grace period 0. The controllers that
        would create pods anew go first (orphaning theirs), or a Deployment's next pod would hold
        devices, terminating forever, into the next test."""
        for group, kind in _POD_MAKERS:
            with contextlib.suppress(ApiStatus):
                self.cp.admin.request(
                    "DELETE", f"/apis/{group}/namespaces/{ns}/{kind}", query={"propagationPolicy": "Orphan"}
                )
        with contextlib.suppress(ApiStatus):
            self.cp.admin.request("DELETE", f"/api/v1/namespaces/{ns}/pods", query={"gracePeriodSeconds": 0})
        wait_until(
            lambda: not self.cp.admin.get(f"/api/v1/namespaces/{ns}/pods")["items"],
            timeout=30,
            what=f"namespace {ns} without pods",
        )

    def events(self, ns: str) -> list[dict[str, Any]]:
        """`kubectl get events` in the namespace, as the user sees them (core/v1 view)."""
        out = self.cp.kubectl("get", "events", "-n", ns, "-o", "json").stdout
        return list(yaml.safe_load(out)["items"])


RACK = "topoalloc.io/rack"

# Controllers that create pods, removed before a test namespace's pods.
_POD_MAKERS = (
    ("apps/v1", "deployments"),
    ("apps/v1", "replicasets"),
    ("apps/v1", "statefulsets"),
    ("batch/v1", "jobs"),
)


@contextlib.contextmanager
def ready_nodes(
    cluster: ClusterEnv, labels: Mapping[str, dict[str, str]], fixture: str = "dgx-h100", *, gpus: int = 8
) -> Iterator[None]:
    """For a module fixture: a node of `fixture` per name of `labels` (with those labels and its
    agent), ready once each has its Device; removed afterwards."""
    for name, node_labels in labels.items():
        cluster.add_node(name, fixture, gpus=gpus, labels=node_labels)
    for name in labels:
        cluster.wait_device(name)
    yield
    for name in labels:
        cluster.remove_node(name)


def racked_dgx_nodes(cluster: ClusterEnv, racks: dict[str, str]) -> Iterator[dict[str, str]]:
    """For a module fixture: a DGX H100 node per name, labelled with its rack (`RACK`), ready once
    each has its Device; removed afterwards."""
    with ready_nodes(cluster, {name: {RACK: rack} for name, rack in racks.items()}):
        yield racks


def gpu_pod(
    name: str,
    *,
    gpus: int = 0,
    resources: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    node_selector: dict[str, str] | None = None,
) -> dict[str, Any]:
    limits = dict(resources or {})
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}, "labels": labels or {}},
        "spec": {
            "nodeSelector": node_selector or {},
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/train:1",
                    "resources": {"limits": limits, "requests": dict(limits)},
                }
            ],
        },
    }


def allocated(pod: dict[str, Any]) -> dict[str, Any]:
    """The device-allocated annotation of a pod, decoded."""
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(ALLOCATED)
    assert raw, f"pod {pod['metadata']['name']} has no {ALLOCATED}"
    return dict(yaml.safe_load(raw))


def gpu_minors(pod: dict[str, Any]) -> list[int]:
    return sorted(int(g["minor"]) for g in allocated(pod).get("gpu") or [])


def metrics(replica: AllocatorReplica) -> dict[str, float]:
    """The replica's own `topoalloc_*` samples from /metrics, by their full name (labels included)."""
    status, text = replica.health("/metrics")
    assert status == 200
    out = {}
    for line in text.splitlines():
        if line.startswith("topoalloc_") and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def held(replica: AllocatorReplica) -> dict[str, float]:
    """What the allocator counts as taken (per node and device type) and its reservations."""
    keep = re.compile(r"^topoalloc_(allocated_devices\{|reservations$)")
    return {k: v for k, v in metrics(replica).items() if keep.match(k) and v}
