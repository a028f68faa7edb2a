"""`topoalloc explain pod NS/NAME`: the one place to look for what topoalloc decided for a pod and
why. Reads the pod, its Events, its gang's object and members, the Device of the node its
allocation was made for and its ResourceClaims (read-only), and prints the story (story.py)."""

from __future__ import annotations

import time
from typing import Any

import click

from apis import device, dra, keys
from apis import podgroup as pg
from apis import workload as wl
from apis.kinds import CORE_EVENTS, PODS
from topoalloc.commands.kube_access import DEFAULT_WITH_FLAG
from topoalloc.errors import BadInput
from topoalloc.output import dump, output_option

JSON = dict[str, Any]
GANG_KINDS = {
    pg.PODGROUP_SOURCE: (pg.API_VERSION, pg.KIND),
    pg.LEGACY_SOURCE: (pg.API_VERSION, pg.KIND),
    pg.NATIVE_SOURCE: (wl.PODGROUP_API_VERSION, wl.PODGROUP_KIND),
    pg.WORKLOAD_SOURCE: (wl.WORKLOAD_API_VERSION, wl.WORKLOAD_KIND),
}


def pod_name(value: str, namespace: str | None) -> tuple[str, str]:
    """(namespace, name) of `NS/NAME`, or of `NAME` in --namespace (default: default)."""
    parts = value.split("/")
    if len(parts) == 2 and all(parts) and namespace is None:
        return parts[0], parts[1]
    if len(parts) == 1 and parts[0]:
        return namespace or "default", parts[0]
    raise BadInput("POD", value, "expected NAMESPACE/NAME, or NAME with -n NAMESPACE")


def read(cluster: Any, namespace: str, name: str) -> tuple[JSON, Any]:
    """The pod and everything beside it the story needs."""
    from topoalloc.commands.explain.story import Context

    pod = cluster.get(PODS.path(name, namespace=namespace))
    if pod is None:
        raise BadInput("pod", f"{namespace}/{name}", "not found (kubectl get pods -n " + namespace + ")")
    meta = pod.get("metadata") or {}
    ctx = Context()
    uid = meta.get("uid", "")
    query = {"fieldSelector": f"involvedObject.uid={uid}"} if uid else None
    ctx.events = list(
        (cluster.request("GET", CORE_EVENTS.path(namespace=namespace), query=query) or {}).get("items") or []
    )
    annotations = meta.get("annotations") or {}
    node = annotations.get(keys.ALLOCATED_NODE) or (pod.get("spec") or {}).get("nodeName")
    if annotations.get(keys.DEVICE_ALLOCATED) and node:
        path = cluster.path(device.API_VERSION, device.KIND, node)
        ctx.device = cluster.get(path) if path else None
    ctx.gang_object, ctx.members = _gang(cluster, pod, namespace)
    for entry in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
        path = cluster.path(
            f"{dra.GROUP}/{dra.VERSION}", "ResourceClaim", entry.get("resourceClaimName") or "", namespace
        )
        claim = cluster.get(path) if path and entry.get("resourceClaimName") else None
        if claim is not None:
            ctx.claims.append(claim)
    return pod, ctx


def _gang(cluster: Any, pod: JSON, namespace: str) -> tuple[JSON | None, list[JSON]]:
    from apis.errors import CodecError

    try:
        ref = pg.gang_of(pod)
    except CodecError:
        return None, []
    if ref is None:
        return None, []
    obj = None
    if ref.source in GANG_KINDS:
        api_version, kind = GANG_KINDS[ref.source]
        path = cluster.path(api_version, kind, ref.object_key.split("/", 1)[1], namespace)
        obj = cluster.get(path) if path else None
    members = []
    for other in cluster.list("v1", "Pod", namespace=namespace):
        try:
            theirs = pg.gang_of(other)
        except CodecError:
            continue
        if theirs is not None and (theirs.key, theirs.source) == (ref.key, ref.source):
            members.append(other)
    return obj, members


@click.group("explain")
def explain() -> None:
    """Say what topoalloc decided for an object and why."""


@explain.command("pod")
@click.argument("pod")
@click.option("-n", "--namespace", help="The pod's namespace, when POD is a bare NAME.  [default: default]")
@output_option("text", "the story")
@click.option("--kubeconfig", help=f"kubeconfig file ({DEFAULT_WITH_FLAG}).")
@click.option("--context", help="kubeconfig context (default: its current context).")
@click.option("--in-cluster", is_flag=True, help="Use the pod's service account.")
def pod(
    pod: str,
    namespace: str | None,
    output: str,
    kubeconfig: str | None,
    context: str | None,
    in_cluster: bool,
) -> None:
    """What topoalloc decided for the pod POD (NAMESPACE/NAME) and why: what it waits for, its gang,
    its allocation (the devices, decoded, and how they reach each other), its claims, its pin to a
    node, its gates and conditions, its Events (topoalloc's, kube-scheduler's, kubelet's). Read-only."""
    from topoalloc.commands.explain.render import render
    from topoalloc.commands.explain.story import story
    from topoalloc.commands.installer.cluster import answered, open_cluster

    ns, name = pod_name(pod, namespace)
    cluster = open_cluster(kubeconfig, context, in_cluster)
    found, ctx = answered(lambda: read(cluster, ns, name), cluster.host)
    now = answered(cluster.server_time, cluster.host) or time.time()
    data = story(found, ctx, now)
    if output == "text":
        click.echo(render(data, now), nl=False)
    else:
        click.echo(dump(data, output), nl=False)
