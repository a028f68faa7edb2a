"""`topoalloc topology`: the cluster's topology domains as a tree, with free GPUs per domain.

Read-only: the Nodes (and the Pods bound to them) from a file (`kubectl get nodes,pods -A -o
yaml` writes one) or from the cluster through a kubeconfig. The levels are the allocator's
topology profile (docs/topology.md): detected from the nodes' labels, or named with --profile
(`custom` with --key). A node's GPUs are its allocatable whole GPUs (nvidia.com/gpu,
amd.com/gpu, dcu.com/gpu, or koordinator.sh/gpu in hundreds: the same cards, counted once, by
`apis.resources.node_gpus`); a GPU any bound, active pod asks for (even a share of it) counts as
used.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import click

from apis import resources as rn
from apis.documents import load_documents
from apis.errors import InputError
from apis.topology_profile import AUTO, CUSTOM, GENERIC, PROFILE_NAMES, Detected, resolve
from topoalloc.commands.kube_access import DEFAULT_IN_A_POD, config_error, in_a_pod, require_kubeconfig
from topoalloc.errors import BadInput, Failure
from topoalloc.output import dump, output_option

JSON = dict[str, Any]
UNLABELLED = "(no topology labels)"


@dataclass
class NodeGPUs:
    name: str
    labels: Mapping[str, str]
    total: int
    used: int = 0

    @property
    def free(self) -> int:
        return max(0, self.total - self.used)


@dataclass
class Domain:
    level: str  # the level's name ("" for the unlabelled group)
    key: str
    value: str
    children: dict[str, Domain] = field(default_factory=dict)
    nodes: list[NodeGPUs] = field(default_factory=list)  # nodes directly under it

    def all_nodes(self) -> list[NodeGPUs]:
        return self.nodes + [n for c in self.children.values() for n in c.all_nodes()]

    def totals(self) -> tuple[int, int, int]:
        nodes = self.all_nodes()
        return len(nodes), sum(n.free for n in nodes), sum(n.total for n in nodes)


def node_gpus(nodes: Iterable[JSON], pods: Iterable[JSON]) -> list[NodeGPUs]:
    """Each Node's whole GPUs and how many of them the bound, active pods ask for."""
    out = {}
    for node in nodes:
        meta = node.get("metadata") or {}
        alloc = (node.get("status") or {}).get("allocatable") or {}
        out[meta.get("name", "")] = NodeGPUs(
            meta.get("name", ""), meta.get("labels") or {}, rn.node_gpus(alloc)
        )
    for pod in pods:
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        where = out.get(spec.get("nodeName") or "")
        if where is None or status.get("phase") in rn.TERMINAL_POD_PHASES:
            continue
        for c in spec.get("containers") or []:
            where.used += rn.pod_gpus(((c or {}).get("resources") or {}).get("requests") or {})
    return sorted(out.values(), key=lambda n: n.name)


def domain_tree(detected: Detected, nodes: Sequence[NodeGPUs]) -> list[Domain]:
    """The domains widest level first, each node under the domains its labels name (levels it
    has no label for are skipped); nodes with no level label at all under one group."""
    levels = list(reversed(detected.profile.levels))
    roots: dict[str, Domain] = {}
    loose = Domain("", "", UNLABELLED)
    for node in nodes:
        children, parent = roots, None
        for level in levels:
            value = node.labels.get(level.key)
            if value is None:
                continue
            name = f"{level.key}={value}"
            if name not in children:
                children[name] = Domain(level.name, level.key, value)
            parent = children[name]
            children = parent.children
        (parent or loose).nodes.append(node)
    out = sorted(roots.values(), key=lambda d: d.value)
    return out + ([loose] if loose.nodes else [])


def render(detected: Detected, roots: Sequence[Domain], *, show_nodes: bool = True) -> str:
    p = detected.profile
    how = (
        f"detected: {detected.nodes} of {detected.total} nodes carry its labels"
        if detected.total
        else "as configured"
    )
    lines = [
        f"profile {p.name} ({how})",
        "levels: " + " < ".join(f"{lv.name} ({lv.key})" for lv in p.levels),
        "",
        f"{'DOMAIN':<48} {'NODES':>5} {'FREE GPUs':>11}",
    ]

    def walk(d: Domain, depth: int) -> None:
        count, free, total = d.totals()
        label = f"{d.level} {d.value}" if d.level else d.value
        lines.append(f"{'  ' * depth + label:<48} {count:>5} {f'{free} / {total}':>11}")
        for child in sorted(d.children.values(), key=lambda c: c.value):
            walk(child, depth + 1)
        if show_nodes:
            for n in sorted(d.nodes, key=lambda n: n.name):
                lines.append(
                    f"{'  ' * (depth + 1) + 'node ' + n.name:<48} {'':>5} {f'{n.free} / {n.total}':>11}"
                )

    for root in roots:
        walk(root, 0)
    return "\n".join(lines) + "\n"


def as_data(detected: Detected, roots: Sequence[Domain]) -> JSON:
    def data(d: Domain) -> JSON:
        count, free, total = d.totals()
        out: JSON = {"level": d.level, "key": d.key, "value": d.value, "nodes": count, "freeGPUs": free}
        out["gpus"] = total
        if d.children:
            out["domains"] = [data(c) for c in sorted(d.children.values(), key=lambda c: c.value)]
        if d.nodes:
            out["nodeList"] = [{"name": n.name, "freeGPUs": n.free, "gpus": n.total} for n in d.nodes]
        return out

    p = detected.profile
    return {
        "profile": p.name,
        "detected": {"nodes": detected.nodes, "of": detected.total} if detected.total else None,
        "levels": [{"name": lv.name, "key": lv.key} for lv in p.levels],
        "domains": [data(r) for r in roots],
    }


def _from_file(path: str) -> tuple[list[JSON], list[JSON]]:
    try:
        docs = load_documents(path, "nodes file")
    except InputError as exc:
        raise BadInput(exc.what, exc.where, exc.why) from None
    items: list[Any] = []
    for doc in docs:
        is_list = isinstance(doc, dict) and isinstance(doc.get("items"), list)
        items.extend(doc["items"] if is_list else [doc])
    nodes = [i for i in items if isinstance(i, dict) and i.get("kind") == "Node"]
    pods = [i for i in items if isinstance(i, dict) and i.get("kind") == "Pod"]
    if not nodes:
        raise BadInput("nodes file", path, "holds no Node (kubectl get nodes -o yaml writes them)")
    return nodes, pods


def _from_cluster(kubeconfig: str | None) -> tuple[list[JSON], list[JSON]]:
    from kubernetes.client import CoreV1Api
    from kubernetes.config import ConfigException

    from agent.kube import TRANSPORT_ERRORS, api_client, short_error

    if not kubeconfig and not in_a_pod():
        kubeconfig = require_kubeconfig(None)
    try:
        client = api_client(kubeconfig)
    except ConfigException as exc:
        raise config_error(kubeconfig, exc, in_cluster=not kubeconfig) from None
    core = CoreV1Api(client)
    try:
        nodes = json.loads(core.list_node(_preload_content=False).data)["items"]
        bound = core.list_pod_for_all_namespaces(field_selector="spec.nodeName!=", _preload_content=False)
        pods = json.loads(bound.data)["items"]
    except TRANSPORT_ERRORS as exc:
        raise Failure("cluster", kubeconfig or "in-cluster", short_error(exc)) from None
    for n in nodes:
        n.setdefault("kind", "Node")
    for p in pods:
        p.setdefault("kind", "Pod")
    return nodes, pods


@click.command("topology")
@click.argument("nodes_file", required=False, type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--kubeconfig",
    type=click.Path(exists=True, dir_okay=False),
    help=f"kubeconfig file of the cluster to read the Nodes and Pods from ({DEFAULT_IN_A_POD}).",
)
@click.option(
    "--profile",
    type=click.Choice(PROFILE_NAMES),
    default=AUTO,
    show_default=True,
    help="The topology profile (auto: detected from the nodes' labels, as the allocator does).",
)
@click.option(
    "--key", "keys_", multiple=True, help="With --profile custom: a level's node label, narrowest first."
)
@click.option("--nodes/--no-nodes", "show_nodes", default=True, show_default=True, help="List each node.")
@output_option("tree", "the domains")
def topology(
    nodes_file: str | None,
    kubeconfig: str | None,
    profile: str,
    keys_: tuple[str, ...],
    show_nodes: bool,
    output: str,
) -> None:
    """Print the topology domains (zone, spine, leaf, clique) as a tree with free GPUs per domain."""
    if nodes_file and kubeconfig:
        raise click.UsageError("give a NODES_FILE or --kubeconfig, not both")
    if keys_ and profile != CUSTOM:
        raise click.UsageError("--key needs --profile custom")
    if profile == CUSTOM and not keys_:
        raise click.UsageError("--profile custom needs at least one --key")
    nodes, pods = _from_file(nodes_file) if nodes_file else _from_cluster(kubeconfig)
    gpus = node_gpus(nodes, pods)
    detected = resolve(profile, keys_ or GENERIC.keys, GENERIC.keys, (n.labels for n in gpus))
    roots = domain_tree(detected, gpus)
    if output == "tree":
        click.echo(render(detected, roots, show_nodes=show_nodes), nl=False)
    else:
        click.echo(dump(as_data(detected, roots), output), nl=False)
