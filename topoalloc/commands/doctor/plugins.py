"""Kubelet's side of each agent node: the agent's device plugin registered (kubelet then advertises
its resources in the Node's allocatable) or, in dra mode, no device resource advertised by anyone;
and no second device plugin on the agent's nodes (a DaemonSet that serves kubelet's device-plugin
socket, the NVIDIA device plugin or the GPU Operator's): two plugins registering the same
resource with one kubelet hand containers GPUs the allocator did not choose."""

from __future__ import annotations

from apis import dra
from apis import resources as rn
from apis.device import Device
from apis.errors import CodecError
from apis.quantity import Quantity
from topoalloc.commands.doctor.agents import agent_nodes, node_mode
from topoalloc.commands.doctor.facts import AGENT, JSON, Facts, key_of, meta
from topoalloc.commands.doctor.findings import Finding, fail, ok, warn

CHECK = "plugins"
PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
# Served by the agent's device plugins (agent/deviceplugin/inventory.py), owned by kubelet then.
SERVED = (rn.NVIDIA_GPU, rn.GPU_CORE)
OFF = (
    "turn it off on the agent's nodes: GPU Operator: label them nvidia.com/gpu.deploy.device-plugin=false; "
    "otherwise a node affinity keeping it off nodes the agent runs on, or delete it"
)


def healthy_gpus(device: JSON) -> int | None:
    try:
        decoded = Device.from_dict(device)
    except (ValueError, TypeError):
        return None
    return sum(1 for d in decoded.devices if d.type == rn.DeviceType.GPU and d.health)


def _amount(node: JSON, name: str) -> int:
    """A Node's allocatable `name` (0 when absent or not a quantity)."""
    value = ((node.get("status") or {}).get("allocatable") or {}).get(name)
    try:
        return max(0, Quantity.parse(value).value()) if value is not None else 0
    except CodecError:
        return 0


def check_registration(facts: Facts, node: str) -> Finding | None:
    obj = facts.node(node)
    device = next((d for d in facts.devices if meta(d).get("name") == node), None)
    if obj is None or device is None:
        return None  # the agents check names a node without a Device
    gpus = healthy_gpus(device)
    if gpus is None:
        return warn(CHECK, f"Device {node} does not decode", f"kubectl get device {node} -o yaml")
    cards, cores = _amount(obj, rn.NVIDIA_GPU), _amount(obj, rn.GPU_CORE)
    if node_mode(facts, node) == dra.MODE_DRA:
        if cards:
            return fail(
                CHECK,
                f"node {node} is in dra mode, yet it advertises {cards} {rn.NVIDIA_GPU}: another "
                "device plugin serves its GPUs",
                OFF,
            )
        return None
    if gpus and not cards and not cores:
        return fail(
            CHECK,
            f"node {node}: kubelet advertises none of {', '.join(SERVED)} though its Device has {gpus} "
            "healthy "
            "GPU(s): the agent's device plugin is not registered with kubelet",
            "the agent needs kubelet's device-plugins folder (--device-plugin-dir); its log says why it did "
            "not "
            f"register: kubectl -n topoalloc-system logs -l app.kubernetes.io/name={AGENT}",
        )
    if cards and cards != gpus:
        return warn(
            CHECK,
            f"node {node} advertises {cards} {rn.NVIDIA_GPU}, its Device {gpus} healthy GPU(s)",
            "another device plugin may count them; see the next finding",
        )
    return None


def _is_plugin(daemonset: JSON) -> bool:
    """A DaemonSet that serves kubelet device plugins: named so, or mounting kubelet's plugin folder."""
    name = str(meta(daemonset).get("name", ""))
    volumes = ((daemonset.get("spec") or {}).get("template") or {}).get("spec", {}).get("volumes") or []
    paths = [str((v.get("hostPath") or {}).get("path", "")).rstrip("/") for v in volumes]
    return "device-plugin" in name or any(p.startswith(PLUGIN_DIR) for p in paths)


def second_plugins(facts: Facts, agent_on: set[str]) -> list[Finding]:
    out = []
    for ds in facts.daemonsets:
        name, namespace = key_of(ds)
        if (name, namespace) == (AGENT, "topoalloc-system") or not _is_plugin(ds):
            continue
        nodes = sorted(
            {
                str((p.get("spec") or {}).get("nodeName"))
                for p in facts.pods
                if meta(p).get("namespace") == namespace
                and any(
                    o.get("kind") == "DaemonSet" and o.get("name") == name
                    for o in meta(p).get("ownerReferences") or []
                )
                and (p.get("spec") or {}).get("nodeName") in agent_on
            }
        )
        if nodes:
            out.append(
                fail(
                    CHECK,
                    f"DaemonSet {namespace}/{name} runs a second device plugin on the agent's node(s) "
                    f"{', '.join(nodes)}: two plugins for one resource hand containers GPUs the allocator "
                    "did "
                    "not choose",
                    OFF,
                )
            )
    return out


def check(facts: Facts) -> list[Finding]:
    selected, _ = agent_nodes(facts)
    if not selected:
        return []
    out = [f for node in sorted(selected) if (f := check_registration(facts, node)) is not None]
    out += second_plugins(facts, set(selected))
    if not out:
        out.append(
            ok(
                CHECK,
                f"each of the {len(selected)} agent node(s) has its plugin registered and no second "
                "device plugin",
            )
        )
    return out
