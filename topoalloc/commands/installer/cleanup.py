"""`topoalloc cleanup`: take topoalloc's traces off the cluster, the ones no manifest holds: the
agent's labels and extended resources on the Nodes, its ResourceSlices, topoalloc's DeviceClasses,
and the scheduling gates its webhooks put on pods. Run by `topoalloc uninstall` after it deleted
the objects, and by the chart's pre-delete hook (in the cluster, with its ServiceAccount).

The order is what makes it stick, whoever calls it:

1. the webhook configurations go first, so no new gate is put on a pod while the rest goes;
2. the agent DaemonSets go, and cleanup waits for their pods to be gone: a running agent writes its
   labels, resources and slices again on its next pass, and kubelet reports a device plugin's
   resources while the plugin is registered (once the agent stops, kubelet drops those itself);
3. then the Nodes, slices, DeviceClasses and gates; on a node whose agent pod is still there
   (no kubelet confirms it stopped before the timeout), the Node and its slices are left, and said.

The decisions (what is topoalloc's on an object, the patches) are traces.py's; this sends them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from allocator.runtime.kube import JSON_PATCH
from apis import dra, reservation
from apis.kinds import NODES, PODS
from topoalloc.commands.installer import traces
from topoalloc.commands.installer.cluster import ApiError, Cluster, Doc
from topoalloc.commands.installer.manifests import NAMESPACE
from topoalloc.commands.installer.report import Report

SELECTOR = f"{traces.PART_OF}=topoalloc"
WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
ADMISSION = "admissionregistration.k8s.io/v1"
RETRIES = 3  # a node or pod changed between the read and the patch: read again, this often


@dataclass
class Cleanup:
    """What a cleanup said (lines: done; warnings: not done), and whether all went."""

    report: Report = field(default_factory=Report)
    problems: int = 0
    leftovers: traces.Leftovers = field(default_factory=traces.Leftovers)

    def failed(self, line: str) -> None:
        self.problems += 1
        self.report.warn(line)


class _Run:
    def __init__(
        self,
        cluster: Cluster,
        namespace: str,
        dry_run: bool,
        sleep: Callable[[float], None],
        clock: Callable[[], float],
        owners: str,
    ) -> None:
        self.cluster, self.namespace, self.dry_run, self.owners = cluster, namespace, dry_run, owners
        self.sleep, self.clock = sleep, clock
        self.out = Cleanup()
        self.verb = "would remove" if dry_run else "removed"

    def delete(self, doc: Doc, what: str) -> None:
        try:
            if self.dry_run or self.cluster.delete(doc):
                self.out.report.say(f"{'would delete' if self.dry_run else 'deleted'} {what}")
        except ApiError as exc:
            self.out.failed(f"{what}: not deleted: {exc}")

    # 1. no new gates --------------------------------------------------------------------------------
    def stop_webhooks(self) -> None:
        for kind in WEBHOOK_KINDS:
            for doc in self.cluster.list(ADMISSION, kind, selector=self.owners):
                self.delete(doc, f"{kind} {doc['metadata']['name']}")

    # 2. no agent writing again ----------------------------------------------------------------------
    def stop_agents(self, timeout: float) -> set[str]:
        """Delete the agent DaemonSets, wait for their pods to go; the nodes where one is left."""
        for doc in self.cluster.list("apps/v1", "DaemonSet", namespace=self.namespace, selector=self.owners):
            self.delete(doc, f"DaemonSet {self.namespace}/{doc['metadata']['name']}")
        if self.dry_run:
            return set()
        deadline = self.clock() + timeout
        while True:
            left = self.agent_pods()
            if not left or self.clock() >= deadline:
                break
            self.sleep(1.0)
        nodes = {str((p.get("spec") or {}).get("nodeName") or "") for p in left} - {""}
        if left:
            self.out.failed(
                f"{len(left)} agent pod(s) still there after {timeout:.0f} s "
                f"(on {', '.join(sorted(nodes))}): "
                "their Nodes and ResourceSlices are left as they are; run topoalloc cleanup again once the "
                "pods are gone"
            )
        return nodes

    def agent_pods(self) -> list[Doc]:
        """The pods of a DaemonSet in topoalloc's namespace (the agent's pools), deleted or not."""
        return [
            p
            for p in self.cluster.list("v1", "Pod", namespace=self.namespace)
            if any(o.get("kind") == "DaemonSet" for o in p["metadata"].get("ownerReferences") or [])
        ]

    # 3. what the agent wrote, gates -----------------------------------------------------------------
    def nodes(self, skip: set[str]) -> None:
        for node in self.cluster.list("v1", "Node"):
            name = node["metadata"]["name"]
            if name not in skip:
                self.node(node)

    def node(self, node: Doc) -> None:
        name = node["metadata"]["name"]
        found = traces.node_traces(node)
        if found is None:
            return
        try:
            for attempt in range(RETRIES):
                if self.dry_run or not found.resources:
                    break
                try:
                    path = NODES.path(name, subresource="status")
                    self.cluster.patch(path, found.status_patch(node), content_type=JSON_PATCH)
                    break
                except ApiError as exc:  # 422: a test failed, the node changed meanwhile
                    if exc.status != 422 or attempt == RETRIES - 1:
                        raise
                    again = self.cluster.get(NODES.path(name))
                    found = traces.node_traces(again) if again is not None else None
                    if found is None:
                        return  # gone, or no longer marked as the agent's: nothing of ours to take
                    node = again
            if not self.dry_run:
                self.cluster.merge_patch(NODES.path(name), found.label_patch())
        except ApiError as exc:
            self.out.failed(f"node {name}: traces not removed: {exc}")
            return
        parts = [f"labels {', '.join(found.labels)}"]
        if found.resources:
            parts.append(f"status resources {', '.join(found.resources)}")
        self.out.report.say(f"{self.verb} from node {name}: {'; '.join(parts)}")

    def slices(self, skip: set[str]) -> None:
        for doc in self.cluster.list(dra.API_VERSION, "ResourceSlice"):
            if traces.ours_slice(doc) and (doc.get("spec") or {}).get("nodeName") not in skip:
                self.delete(doc, f"ResourceSlice {doc['metadata']['name']}")

    def device_classes(self) -> None:
        for doc in self.cluster.list(dra.API_VERSION, "DeviceClass", selector=SELECTOR):
            if traces.ours_device_class(doc):
                self.delete(doc, f"DeviceClass {doc['metadata']['name']}")

    def gates(self, pods: list[Doc]) -> None:
        for pod in pods:
            gates = traces.released_gates(pod)
            if not gates:
                continue
            what = f"pod {traces.key(pod)}"
            try:
                if not self.dry_run:
                    self.release(pod)
            except ApiError as exc:
                self.out.failed(f"{what}: gates {', '.join(gates)} not released: {exc}")
                continue
            verb = "would release" if self.dry_run else "released"
            self.out.report.say(f"{verb} scheduling gate(s) {', '.join(gates)} of {what}")

    def release(self, pod: Doc) -> None:
        meta = pod["metadata"]
        path = PODS.path(meta["name"], namespace=meta["namespace"])
        for attempt in range(RETRIES):
            ops = traces.gate_release(pod)
            if not ops:
                return
            try:
                self.cluster.patch(path, ops, content_type=JSON_PATCH)
                return
            except ApiError as exc:
                if exc.status == 404:
                    return
                if exc.status != 422 or attempt == RETRIES - 1:
                    raise
                found = self.cluster.get(path)
                if found is None or found["metadata"].get("uid") != meta.get("uid"):
                    return  # gone, or another pod under the name: not ours to touch
                pod = found

    def leftovers(self, pods: list[Doc]) -> None:
        claims = self.cluster.list(dra.API_VERSION, "ResourceClaim")
        held = self.cluster.list(reservation.API_VERSION, reservation.KIND)
        self.out.leftovers = traces.leftovers(claims, held, pods)
        for line in self.out.leftovers.lines():
            self.out.report.say(line)


def cleanup(
    cluster: Cluster,
    *,
    namespace: str = NAMESPACE,
    dry_run: bool = False,
    timeout: float = 120.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    owners: str = SELECTOR,
) -> Cleanup:
    """`owners`: the label selector of the webhook configurations and agent DaemonSets to delete
    (uninstall: the installer's own only, so it never stops a Helm release's)."""
    run = _Run(cluster, namespace, dry_run, sleep, clock, owners)
    run.stop_webhooks()
    busy = run.stop_agents(timeout)
    run.nodes(busy)
    run.slices(busy)
    run.device_classes()
    pods = cluster.list("v1", "Pod")
    run.gates(pods)
    run.leftovers(pods)
    return run.out
