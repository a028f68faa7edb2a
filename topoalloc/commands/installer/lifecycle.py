"""`install` and `upgrade`: look at the cluster, render, label GPU nodes, apply, prune.

Both end in `deploy()`: the same render and server-side apply. `upgrade` starts from the options
recorded by the last install (ConfigMap topoalloc-install) and changes the version (and what its
flags say); the agent DaemonSet and the allocator Deployment then roll by their RollingUpdate
strategy. Allocations are not the installer's: they live in the pods' device-allocated
annotations and the agents' checkpoints (a hostPath), which a rollout keeps.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from apis.kinds import NAMESPACES, NODES, SECRETS, SERVICES
from topoalloc.commands.installer import conflicts, kubeadm, nodes, tls, versions
from topoalloc.commands.installer.cluster import ApiError, Cluster
from topoalloc.commands.installer.kustomize import Doc, ident
from topoalloc.commands.installer.manifests import (
    GPU_NODE_LABEL,
    MANAGED_BY,
    MANAGER,
    MONITORING_API,
    MONITORING_KINDS,
    NAMESPACE,
    ClusterFacts,
    InstallOptions,
    gang_failure_policy,
    render,
)
from topoalloc.commands.installer.removal import prune
from topoalloc.commands.installer.report import Report
from topoalloc.errors import BadInput, Failure

SHARED_KINDS = ("CustomResourceDefinition", "Namespace")
ESTABLISH_TIMEOUT = 60.0


@dataclass
class Request:
    """What the user asked for beyond the recorded options."""

    gpu_nodes: tuple[str, ...] = ()
    gpu_node_selector: str = ""
    rotate_certs: bool = False
    force_conflicts: bool = False
    dry_run: bool = False
    kubeadm_dir: Path = Path("topoalloc-kubeadm")


@dataclass
class Outcome:
    report: Report
    docs: list[Doc]
    options: InstallOptions
    written: list[Path]


def server_version(cluster: Cluster, report: Report) -> versions.KubeVersion:
    text = cluster.version()
    try:
        server = versions.KubeVersion.parse(text)
    except ValueError as exc:
        raise Failure("cluster version", cluster.host, str(exc)) from None
    if (why := versions.server_refusal(server)) is not None:
        raise Failure("cluster", cluster.host, why)
    report.say(
        f"cluster: {cluster.host}, Kubernetes {text} (supported {versions.supported_range()}; "
        f"tested {', '.join(versions.TESTED)})"
    )
    if (note := versions.server_warning(server)) is not None:
        report.warn(note)
    return server


def pin_scheduler(options: InstallOptions, server: versions.KubeVersion, asked: str) -> InstallOptions:
    """The secondary scheduler's version: the server's own, or `asked` when the skew policy allows."""
    if options.mode != "secondary":
        if asked:
            raise BadInput(
                "--scheduler-version",
                asked,
                f"only a second kube-scheduler (--mode secondary) has one, not --mode {options.mode}",
            )
        return replace(options, scheduler_version="")
    if not asked:
        return replace(options, scheduler_version=str(server))
    try:
        wanted = versions.KubeVersion.parse(asked)
    except ValueError as exc:
        raise BadInput("--scheduler-version", asked, str(exc)) from None
    if (why := versions.scheduler_skew(server, wanted)) is not None:
        raise BadInput("--scheduler-version", asked, why)
    return replace(options, scheduler_version=str(wanted))


def deploy(cluster: Cluster, options: InstallOptions, request: Request, root: Path) -> Outcome:
    report = Report()
    server = server_version(cluster, report)
    options = pin_scheduler(options, server, options.scheduler_version)
    if options.certs == "cert-manager" and cluster.resource("cert-manager.io/v1", "Certificate") is None:
        raise Failure(
            "cert-manager",
            cluster.host,
            "cert-manager.io/v1 is not served: install cert-manager first, or use --certs generate",
        )
    _check_monitoring(cluster, options, report)
    all_nodes = cluster.list("v1", "Node")
    labelled = _gpu_nodes(cluster, all_nodes, request)
    facts = ClusterFacts(foreign=_foreign(cluster, options, root, report))
    facts.dra_served = cluster.resource("resource.k8s.io/v1", "DeviceClass") is not None
    if options.certs == "generate":
        facts.tls = _tls(cluster, request, report)
    else:
        report.say("certificates: issued by cert-manager (deploy/components/cert-manager)")
    docs = render(options, facts, root)
    _report_nodes(cluster, all_nodes, docs, labelled, report)
    _report_mode(options, report)
    edited = conflicts.find(cluster, docs)  # before anything changes: all or nothing
    if edited and not (request.dry_run or request.force_conflicts):
        raise Failure("apply", cluster.host, conflicts.refusal(edited))
    for found in edited:
        report.warn(
            f"{found.describe()}: "
            + (
                "changed outside topoalloc; without --dry-run the run stops before applying anything "
                "(keep it with --set/--values, or drop it with --force-conflicts)"
                if request.dry_run
                else "overwritten (--force-conflicts)"
            )
        )
    if request.dry_run:
        return Outcome(report, docs, options, [])
    _wait_namespace_gone(cluster)
    for name in labelled:
        cluster.merge_patch(NODES.path(name), {"metadata": {"labels": {GPU_NODE_LABEL: "true"}}})
    applied = _apply(cluster, docs, request.force_conflicts)
    pruned = prune(cluster, docs, root)
    report.say(
        f"applied {applied} objects (server-side apply, field manager topoalloc-installer)"
        + (f"; removed {len(pruned)} no longer rendered: {', '.join(pruned)}" if pruned else "")
    )
    written = _kubeadm(cluster, options, request, root, report) if options.mode == "kubeadm" else []
    return Outcome(report, docs, options, written)


def _check_monitoring(cluster: Cluster, options: InstallOptions, report: Report) -> None:
    """--monitoring needs the Prometheus Operator's kinds served (refused before anything is
    applied); without it, an install on a cluster that serves them says the option exists."""
    missing = [k for k in MONITORING_KINDS if cluster.resource(MONITORING_API, k) is None]
    if options.monitoring and missing:
        raise Failure(
            "monitoring",
            cluster.host,
            f"{MONITORING_API} {', '.join(missing)} not served: install the Prometheus Operator (or "
            "kube-prometheus-stack) first, or leave out --monitoring",
        )
    if options.monitoring:
        report.say("monitoring: ServiceMonitor, PodMonitor, PrometheusRule, the Grafana dashboard ConfigMap")
    elif not missing:
        report.say(
            "monitoring: the Prometheus Operator's CRDs are served; --monitoring adds scrape targets, "
            "alerts and a Grafana dashboard (docs/monitoring.md)"
        )


def _gpu_nodes(cluster: Cluster, all_nodes: list[Doc], request: Request) -> list[str]:
    """The nodes to label GPU_NODE_LABEL: --gpu-nodes (each must exist) and --gpu-node-selector."""
    names = {str(n["metadata"]["name"]) for n in all_nodes}
    unknown = sorted(set(request.gpu_nodes) - names)
    if unknown:
        raise BadInput("--gpu-nodes", ",".join(request.gpu_nodes), f"no such node: {', '.join(unknown)}")
    chosen = set(request.gpu_nodes)
    if request.gpu_node_selector:
        try:
            matched = cluster.list("v1", "Node", selector=request.gpu_node_selector)
        except ApiError as exc:
            raise BadInput("--gpu-node-selector", request.gpu_node_selector, exc.message) from None
        if not matched:
            raise BadInput("--gpu-node-selector", request.gpu_node_selector, "selects no node")
        chosen |= {str(n["metadata"]["name"]) for n in matched}
    return sorted(chosen)


def _foreign(cluster: Cluster, options: InstallOptions, root: Path, report: Report) -> set[Any]:
    """CRDs and the namespace that exist without the installer's label: left as they are."""
    out = set()
    for doc in render(options, ClusterFacts(), root):
        if doc["kind"] not in SHARED_KINDS:
            continue
        existing = cluster.get(cluster.doc_path(doc))
        labels = ((existing or {}).get("metadata") or {}).get("labels") or {}
        if existing is None or labels.get(MANAGED_BY) == MANAGER:
            continue
        out.add(ident(doc))
        name = doc["metadata"]["name"]
        report.say(
            f"{doc['kind']} {name}: exists and was not created by the installer; left as it is, never deleted"
        )
        device_crd = doc["kind"] == "CustomResourceDefinition" and name.startswith("devices.")
        if device_crd and "nvlink" not in str(existing.get("spec")):
            report.warn(
                f"CRD {name} (another system's) lacks topoalloc's fields (nvlink, pcieSwitchID, "
                "summary): the API server prunes them from every Device, so the allocator sees no NVLink "
                "or PCIe switches; "
                f"apply deploy/crds/{name}.yaml over it (a superset of Koordinator's schema) to keep them"
            )
    return out


def _tls(cluster: Cluster, request: Request, report: Report) -> tls.TlsFiles:
    existing: dict[str, dict[str, bytes]] = {}
    for name in tls.SECRETS:
        secret = cluster.get(SECRETS.path(name, namespace=NAMESPACE))
        if secret is not None:
            existing[name] = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
    why = "--rotate-certs" if request.rotate_certs else tls.unusable(existing) if existing else "none yet"
    if why is None:
        report.say("certificates: kept (the Secrets in the cluster are valid for 30 days or more)")
        return existing
    report.say(f"certificates: generated a CA, the allocator's and kube-scheduler's certificates ({why})")
    if existing and not request.rotate_certs:
        report.warn(f"new certificates: {why}")
    return tls.issue_secrets(NAMESPACE)


def _report_nodes(
    cluster: Cluster, all_nodes: list[Doc], docs: list[Doc], labelled: list[str], report: Report
) -> None:
    daemonset = next(d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"] == nodes.AGENT)
    extra = {name: {GPU_NODE_LABEL: "true"} for name in labelled}
    placement = nodes.agent_placement(all_nodes, daemonset, extra)
    if placement.agent:
        where = ", ".join(f"{n} ({label})" for n, label in sorted(placement.agent.items()))
        report.say(f"agent: on {len(placement.agent)} of {len(all_nodes)} nodes: {where}")
    else:
        report.warn(
            f"the agent runs on none of the {len(all_nodes)} nodes: none carries {nodes.GFD_LABEL} "
            f"(GPU Feature Discovery), {nodes.NFD_LABEL} (Node Feature Discovery) or "
            f"{GPU_NODE_LABEL}=true; pass --gpu-nodes NAME,... or --gpu-node-selector SELECTOR "
            "to label the GPU nodes"
        )
    if placement.unlabelled_gpu_nodes:
        report.warn(
            f"nodes advertising nvidia.com/gpu without a GPU label (no agent there): "
            f"{', '.join(placement.unlabelled_gpu_nodes)}; add them with --gpu-nodes"
        )
    daemonsets = cluster.list("apps/v1", "DaemonSet")
    pods: list[Doc] = []
    for ds in daemonsets:
        name, namespace = ds["metadata"]["name"], ds["metadata"].get("namespace", "")
        if "nvidia-device-plugin" in name or name == nodes.AGENT:
            match = (ds.get("spec") or {}).get("selector", {}).get("matchLabels") or {}
            selector = ",".join(f"{k}={v}" for k, v in match.items())
            pods += cluster.list("v1", "Pod", namespace=namespace, selector=selector)
    for line in nodes.device_plugin_conflicts(placement.agent, all_nodes, daemonsets, pods):
        report.warn(line)


def _report_mode(options: InstallOptions, report: Report) -> None:
    report.say(f"image: {options.image}:{options.version}")
    if options.mode == "placement":
        report.say(
            "scheduler: the cluster's own kube-scheduler, unchanged; every GPU pod is placed by topoalloc "
            "at admission, whatever its scheduler (opt out: label topoalloc.io/placement=false)"
        )
    elif options.mode == "secondary":
        report.say(
            f"scheduler: a second kube-scheduler {options.scheduler_image}:{options.scheduler_version} (the "
            "server's version); pods opt in with spec.schedulerName: topoalloc-scheduler"
        )
    else:
        report.say("scheduler: the cluster's own kube-scheduler calls the allocator (files below)")
    policy = gang_failure_policy(options)
    report.say(
        f"gang webhook: failurePolicy {policy}"
        + (
            " (while no allocator answers, gang members are admitted ungated and the extender holds "
            "them until the whole gang is placed)"
            if policy == "Ignore"
            else " (while no allocator answers, creating a gang member fails; its controller retries)"
        )
    )


def _apply(cluster: Cluster, docs: list[Doc], force: bool) -> int:
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    count = 0
    for doc in docs:
        try:
            cluster.apply(doc, force=force)
        except ApiError as exc:
            where = f"{doc['kind']} {doc['metadata'].get('namespace', '')}/{doc['metadata']['name']}".replace(
                " /", " "
            )
            hint = "; rerun with --force-conflicts to take these fields over" if exc.status == 409 else ""
            raise Failure("apply", where, f"{exc}{hint}") from None
        count += 1
        if crds and doc is crds[-1]:
            _wait_established(cluster, crds)
    return count


def _wait_namespace_gone(cluster: Cluster) -> None:
    """A namespace still terminating (an uninstall moments ago) refuses new objects: wait for it."""
    deadline = time.monotonic() + ESTABLISH_TIMEOUT
    while True:
        found = cluster.get(NAMESPACES.path(NAMESPACE)) or {}
        if not (found.get("metadata") or {}).get("deletionTimestamp"):
            return
        if time.monotonic() > deadline:
            raise Failure(
                "namespace",
                NAMESPACE,
                f"still terminating after {ESTABLISH_TIMEOUT:.0f} s (its pods have not stopped); "
                "run install again once it is gone",
            )
        time.sleep(1.0)


def _wait_established(cluster: Cluster, crds: list[Doc]) -> None:
    deadline = time.monotonic() + ESTABLISH_TIMEOUT
    for crd in crds:
        while True:
            found = cluster.get(cluster.doc_path(crd)) or {}
            conditions = (found.get("status") or {}).get("conditions") or []
            if any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
                break
            if time.monotonic() > deadline:
                raise Failure(
                    "CRD", crd["metadata"]["name"], f"not Established after {ESTABLISH_TIMEOUT:.0f} s"
                )
            time.sleep(0.5)
    cluster.forget_discovery()


def _kubeadm(
    cluster: Cluster, options: InstallOptions, request: Request, root: Path, report: Report
) -> list[Path]:
    service = cluster.get(SERVICES.path("topoalloc-allocator", namespace=NAMESPACE)) or {}
    cluster_ip = str((service.get("spec") or {}).get("clusterIP") or "")
    secret = None
    deadline = time.monotonic() + (60.0 if options.certs == "cert-manager" else 0.0)
    while secret is None:
        secret = cluster.get(SECRETS.path("topoalloc-scheduler-client", namespace=NAMESPACE))
        if secret is None and time.monotonic() > deadline:
            raise Failure(
                "Secret", f"{NAMESPACE}/topoalloc-scheduler-client", "not there (cert-manager not issuing?)"
            )
        if secret is None:
            time.sleep(1.0)
    client = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
    written = kubeadm.write(request.kubeadm_dir, kubeadm.files(root, cluster_ip, client))
    report.say(f"allocator Service ClusterIP: {cluster_ip}")
    for line in kubeadm.instructions(request.kubeadm_dir):
        report.say(line)
    return written
