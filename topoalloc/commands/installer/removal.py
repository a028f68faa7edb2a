"""`uninstall`, and the prune step of `install`/`upgrade`: deleting what the installer made.

Only objects carrying `app.kubernetes.io/managed-by: topoalloc` are ever deleted, so a CRD another
system owns (Koordinator's Device, scheduler-plugins' PodGroup) and a namespace someone else made
are never touched. Order matters for safety: the admission webhooks go first, so no webhook that
could block pod creation (or gate a pod) outlives the allocator that answers it; then the workloads;
then cleanup.py waits for the agent pods to go and removes what no manifest holds (the agent's Node
labels and status resources, ResourceSlices, DeviceClasses, scheduling gates). CRDs (and with them
every Device, PodGroup and Reservation) go only with --purge. After `install --mode kubeadm` the
files copied onto the control-plane nodes are out of reach: uninstall says how to undo them.
"""

from __future__ import annotations

from pathlib import Path

from apis.kinds import NODES, PODS, SERVICES
from topoalloc.commands.installer import kubeadm, manifests
from topoalloc.commands.installer.cleanup import Cleanup, cleanup
from topoalloc.commands.installer.cluster import Cluster
from topoalloc.commands.installer.kustomize import Doc, ident
from topoalloc.commands.installer.manifests import GPU_NODE_LABEL, MANAGED_BY, MANAGER, NAMESPACE
from topoalloc.commands.installer.record import recorded_options
from topoalloc.commands.installer.report import Report

SELECTOR = f"{MANAGED_BY}={MANAGER}"
KEPT_BY_PRUNE = ("CustomResourceDefinition", "Namespace")
GANG_GATE = "topoalloc.io/gang"
SCHEDULER = "topoalloc-scheduler"


def ours(cluster: Cluster, root: Path | None = None) -> list[Doc]:
    """Every object in the cluster the installer made, webhook configurations first, then in
    reverse apply order."""
    found = []
    for api_version, kind in manifests.kinds(root):
        found += cluster.list(api_version, kind, selector=SELECTOR)
    webhooks = [d for d in found if d["kind"] == "MutatingWebhookConfiguration"]
    return webhooks + [d for d in found if d["kind"] != "MutatingWebhookConfiguration"]


def _name(doc: Doc) -> str:
    meta = doc["metadata"]
    where = f"{meta['namespace']}/" if meta.get("namespace") else ""
    return f"{doc['kind']} {where}{meta['name']}"


def prune(cluster: Cluster, rendered: list[Doc], root: Path | None = None) -> list[str]:
    """Delete our objects that the current render no longer has (another mode, an older version's
    leftovers); CRDs and the namespace stay."""
    keep = {ident(d) for d in rendered}
    gone = []
    for doc in ours(cluster, root):
        if doc["kind"] in KEPT_BY_PRUNE or ident(doc) in keep:
            continue
        if cluster.delete(doc):
            gone.append(_name(doc))
    return gone


def uninstall(
    cluster: Cluster, *, purge: bool, dry_run: bool, root: Path | None = None, timeout: float = 120.0
) -> Cleanup:
    """Delete the installer's objects, then clean up (cleanup.py); what was done and left is the
    result's report, `problems` counting what could not be removed."""
    recorded = recorded_options(cluster)
    service = cluster.get(SERVICES.path("topoalloc-allocator", namespace=NAMESPACE)) or {}
    cluster_ip = str((service.get("spec") or {}).get("clusterIP") or "")
    found = ours(cluster, root)
    done = Cleanup()
    report = done.report
    if not found:
        report.say("nothing to remove: no object carries " + SELECTOR)
    crds = [d for d in found if d["kind"] == "CustomResourceDefinition"]
    namespaces = [d for d in found if d["kind"] == "Namespace"]
    rest = [d for d in found if d["kind"] not in KEPT_BY_PRUNE]
    doomed = rest + (crds if purge else []) + namespaces
    verb = "would delete" if dry_run else "deleted"
    for doc in doomed:
        if dry_run or cluster.delete(doc):
            report.say(f"{verb} {_name(doc)}")
    if crds and not purge:
        names = ", ".join(d["metadata"]["name"] for d in crds)
        report.say(f"kept CRDs {names} and every Device, PodGroup and Reservation (--purge deletes them)")
    if namespaces and not dry_run:
        report.say(f"namespace {namespaces[0]['metadata']['name']}: goes once its pods have stopped")
    if purge:
        # topoalloc's own label key: whoever set it (--gpu-nodes or by hand) set it for topoalloc.
        for node in cluster.list("v1", "Node", selector=GPU_NODE_LABEL):
            name = node["metadata"]["name"]
            if not dry_run:
                cluster.merge_patch(NODES.path(name), {"metadata": {"labels": {GPU_NODE_LABEL: None}}})
            report.say(f"{'would remove' if dry_run else 'removed'} label {GPU_NODE_LABEL} from node {name}")
    cleaned = cleanup(cluster, dry_run=dry_run, timeout=timeout, owners=SELECTOR)
    report.lines += cleaned.report.lines
    report.warnings += cleaned.report.warnings
    done.problems, done.leftovers = cleaned.problems, cleaned.leftovers
    schedulers = kubeadm.wired_schedulers(cluster.list("v1", "Pod", namespace="kube-system"))
    if (recorded is not None and recorded.mode == "kubeadm") or schedulers:
        for line in kubeadm.undo_instructions(root or manifests.repo_root(), cluster_ip, schedulers):
            report.warn(line)
    _report_waiting_pods(cluster, report)
    return done


def _report_waiting_pods(cluster: Cluster, report: Report) -> None:
    """Pods that only topoalloc would ever schedule: after uninstall they stay pending."""
    gated, ours_by_name = [], []
    for pod in cluster.items(PODS.path(), selector=""):
        spec = pod.get("spec") or {}
        if spec.get("nodeName"):
            continue
        key = f"{pod['metadata'].get('namespace')}/{pod['metadata']['name']}"
        if any(g.get("name") == GANG_GATE for g in spec.get("schedulingGates") or []):
            gated.append(key)
        elif spec.get("schedulerName") == SCHEDULER:
            ours_by_name.append(key)
    if gated:
        report.warn(
            f"{len(gated)} pending pod(s) keep the {GANG_GATE} scheduling gate and stay pending until "
            f"it is removed or topoalloc is installed again: {_some(gated)}"
        )
    if ours_by_name:
        report.warn(
            f"{len(ours_by_name)} pending pod(s) name schedulerName {SCHEDULER}, which no longer runs: "
            f"{_some(ours_by_name)}"
        )


def _some(keys: list[str]) -> str:
    return ", ".join(keys[:5]) + (" ..." if len(keys) > 5 else "")
