"""The node agents: one on every GPU node (the DaemonSet's own node affinity says which; a node that
advertises GPUs without a GPU label has none), ready, and publishing: a Device per node whose
`status.updateTime` the agent refreshes while nothing changes (a stale one means the agent
stopped), and in dra mode the node's ResourceSlices."""

from __future__ import annotations

from apis import dra
from apis.timestamps import parse_time
from topoalloc.commands.doctor.facts import AGENT, JSON, NAMESPACE, Facts, meta, pod_state, ready
from topoalloc.commands.doctor.findings import Finding, fail, ok, warn
from topoalloc.commands.installer.nodes import agent_placement
from topoalloc.output import ago

CHECK = "agents"
DEFAULT_REFRESH = 300.0  # agent/config.py's statusRefreshSeconds
DEFAULT_RESYNC = 10.0
LOGS = f"kubectl -n {NAMESPACE} logs -l app.kubernetes.io/name={AGENT} --tail 50"


def stale_after(facts: Facts, given: float | None) -> float | None:
    """How old a Device's updateTime may be: `given`, else two refresh intervals and a resync of
    the installed agents' config. None: the agents never refresh it (staleness is not judged)."""
    if given is not None:
        return given
    config = facts.agent_config()
    refresh = float(config.get("statusRefreshSeconds", DEFAULT_REFRESH) or 0)
    if refresh <= 0:
        return None
    return 2 * refresh + float(config.get("resyncSeconds", DEFAULT_RESYNC) or 0)


def agent_nodes(facts: Facts) -> tuple[dict[str, str], list[str]]:
    """(the nodes the agent DaemonSet selects -> the label that selects it, nodes advertising GPUs
    that no GPU label selects)."""
    daemonset = facts.daemonset(AGENT)
    if daemonset is None:
        return {}, []
    placement = agent_placement(facts.nodes, daemonset, {})
    return placement.agent, placement.unlabelled_gpu_nodes


def node_mode(facts: Facts, node: str) -> str:
    labels = meta(facts.node(node)).get("labels") or {}
    return str(labels.get(dra.MODE_LABEL) or facts.agent_config().get("mode") or dra.MODE_DEVICE_PLUGIN)


def _device(facts: Facts, node: str) -> JSON | None:
    return next((d for d in facts.devices if meta(d).get("name") == node), None)


def check_node(facts: Facts, node: str, pods: list[JSON], limit: float | None, skew: float) -> list[Finding]:
    here = [p for p in pods if (p.get("spec") or {}).get("nodeName") == node]
    if not here:
        return [
            fail(
                CHECK,
                f"node {node}: no agent pod, though the DaemonSet selects it",
                f"kubectl -n {NAMESPACE} describe daemonset {AGENT} (a taint it does not tolerate?)",
            )
        ]
    out = []
    if not any(ready(p) for p in here):
        out.append(fail(CHECK, f"node {node}: the agent is not ready", LOGS, [pod_state(p) for p in here]))
    device = _device(facts, node)
    if device is None:
        return [*out, fail(CHECK, f"node {node}: no Device published", f"its agent's log: {LOGS}")]
    stamp = parse_time((device.get("status") or {}).get("updateTime"))
    if stamp is None:
        out.append(
            warn(
                CHECK,
                f"Device {node} has no status.updateTime: its freshness cannot be judged",
                "upgrade the agents (topoalloc upgrade): they stamp it",
            )
        )
    elif limit is not None and facts.now - stamp > limit:
        out.append(
            fail(
                CHECK,
                f"Device {node} is stale: last refreshed {ago(facts.now - stamp)} ago (more than "
                f"{ago(limit)}): its agent stopped publishing, so the allocator places on old health and "
                "devices",
                f"is the agent on {node} running? kubectl -n {NAMESPACE} get pods -o wide "
                f"--field-selector spec.nodeName={node}; {LOGS}",
            )
        )
    elif stamp - facts.now > skew:
        out.append(
            warn(
                "clock",
                f"Device {node} was refreshed {ago(stamp - facts.now)} in the future of the API "
                f"server's clock: {node}'s clock runs ahead",
                "keep the nodes' clocks in step",
            )
        )
    if node_mode(facts, node) == dra.MODE_DRA:
        slices = [
            s
            for s in facts.slices
            if (s.get("spec") or {}).get("driver") == dra.DRIVER
            and (s.get("spec") or {}).get("nodeName") == node
        ]
        if not slices:
            out.append(
                fail(
                    CHECK,
                    f"node {node} is in dra mode but has no ResourceSlice of {dra.DRIVER}: "
                    "no claim can be allocated there",
                    f"its agent's log: {LOGS}",
                )
            )
    return out


def check(facts: Facts, given_stale_after: float | None, skew: float) -> list[Finding]:
    if facts.daemonset(AGENT) is None:
        return [
            fail(
                CHECK, f"no DaemonSet {NAMESPACE}/{AGENT}: no node publishes its devices", "topoalloc install"
            )
        ]
    selected, unlabelled = agent_nodes(facts)
    limit = stale_after(facts, given_stale_after)
    out: list[Finding] = []
    if unlabelled:
        out.append(
            warn(
                CHECK,
                f"{len(unlabelled)} node(s) advertise GPUs without a GPU label, so no agent runs there: "
                + ", ".join(unlabelled),
                f"topoalloc install --gpu-nodes {','.join(unlabelled)} (labels them "
                "topoalloc.io/gpu-node=true)",
            )
        )
    if not selected:
        return [
            *out,
            warn(
                CHECK,
                "the agent DaemonSet selects no node: no GPU node is labelled",
                "topoalloc install --gpu-nodes NAME,... (or GPU / Node Feature Discovery)",
            ),
        ]
    pods = facts.pods_of(AGENT)
    problems = [f for node in sorted(selected) for f in check_node(facts, node, pods, limit, skew)]
    out += problems
    if not any(f.check == CHECK and f.status != "ok" for f in problems):
        freshness = f"refreshed within {ago(limit)}" if limit is not None else "freshness not judged"
        out.append(
            ok(
                CHECK,
                f"an agent on each of the {len(selected)} GPU node(s), ready, its Device {freshness}",
                [f"{n} (selected by {label})" for n, label in sorted(selected.items())],
            )
        )
    return out
