"""What topoalloc decided for one pod and why, as data: its gang, its allocation (device-allocated
and the node it was made for, each device as the node's Device describes it, how the chosen
devices reach each other), its DRA claims, its pin (node affinity or nomination), its gates and
conditions, its Events (topoalloc's, kube-scheduler's, kubelet's) and what it waits for. Pure: the
objects in, the story out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

from agent.fixtures.topo_matrix import relation
from apis import dra, keys
from apis.annotations import parse_device_allocated
from apis.device import Device, DeviceInfo
from apis.errors import CodecError
from apis.podgroup import GangRef, gang_of
from topoalloc.commands.explain.waits import conditions, event_time, reporter, waits

JSON = dict[str, Any]


@dataclass
class Context:
    """What was read beside the pod."""

    events: list[JSON] = field(default_factory=list)
    device: JSON | None = None  # the Device of the node its allocation was made for
    gang_object: JSON | None = None  # the PodGroup / Workload its gang names
    members: list[JSON] = field(default_factory=list)  # the pods of its gang (itself included)
    claims: list[JSON] = field(default_factory=list)  # its ResourceClaims


def gang_story(pod: JSON, ctx: Context) -> JSON | None:
    try:
        ref: GangRef | None = gang_of(pod)
    except CodecError as exc:
        return {"error": str(exc)}
    if ref is None:
        return None
    out: JSON = {"name": ref.key, "source": ref.source}
    if ref.source == "koordinator":
        out["minAvailable"] = ref.min_available
    obj = ctx.gang_object
    if ref.object_key and obj is None:
        out["object"] = f"{ref.object_key} does not exist: the gang waits for it"
    elif obj is not None:
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        out["object"] = f"{obj.get('kind')} {ref.object_key}"
        size = spec.get("minMember") or ((spec.get("schedulingPolicy") or {}).get("gang") or {}).get(
            "minCount"
        )
        if size is not None:
            out["minMember"] = size
        if status.get("phase"):
            out["phase"] = status["phase"]
        said = [
            f"{c.get('type')}={c.get('status')}: {c.get('message', '')}"
            for c in status.get("conditions") or []
        ]
        if said:
            out["conditions"] = said
    out["members"] = sorted(
        f"{(m.get('metadata') or {}).get('name')} ({(m.get('spec') or {}).get('nodeName') or 'not bound'})"
        for m in ctx.members
    )
    return out


def _describe(dev: DeviceInfo) -> JSON:
    out: JSON = {"type": dev.type, "minor": dev.minor, "healthy": dev.health}
    if dev.id:
        out["id"] = dev.id
    topo = dev.topology
    if topo is not None:
        out["numa"] = topo.node_id
        if topo.pcie_switch_id:
            out["pcieSwitch"] = topo.pcie_switch_id
        if topo.bus_id:
            out["bus"] = topo.bus_id
    if dev.nvlink is not None:
        out["nvlinkDomain"] = dev.nvlink.domain
    return out


def allocation_story(pod: JSON, ctx: Context) -> JSON | None:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    text = annotations.get(keys.DEVICE_ALLOCATED)
    if not text:
        return None
    node = annotations.get(keys.ALLOCATED_NODE) or (pod.get("spec") or {}).get("nodeName") or ""
    out: JSON = {"node": node, "annotation": keys.DEVICE_ALLOCATED}
    bound = (pod.get("spec") or {}).get("nodeName")
    if bound and node and bound != node:
        out["note"] = f"made for {node} but bound to {bound}: the agent on {bound} chooses anew"
    try:
        allocations = parse_device_allocated(text)
    except (CodecError, ValueError) as exc:
        out["error"] = f"does not decode: {exc}"
        return out
    device = None
    if ctx.device is not None:
        try:
            device = Device.from_dict(ctx.device)
        except (CodecError, ValueError):
            device = None
    known = {(d.type, d.minor): d for d in (device.devices if device else [])}
    chosen: list[DeviceInfo] = []
    rows = []
    for dtype, entries in sorted(allocations.by_type.items()):
        for entry in entries:
            info = known.get((dtype, entry.minor))
            row: JSON = _describe(info) if info else {"type": dtype, "minor": entry.minor}
            if entry.resources:
                row["resources"] = {k: str(v) for k, v in sorted(entry.resources.items())}
            if entry.vfs:
                row["vfs"] = [vf.bus_id or str(vf.minor) for vf in entry.vfs]
            if info is not None:
                chosen.append(info)
            rows.append(row)
    out["devices"] = rows
    links = [
        f"{a.type}{a.minor}-{b.type}{b.minor} {relation(a, b).strip()}" for a, b in combinations(chosen, 2)
    ]
    if links:
        out["links"] = links
    if device is None:
        out["deviceNote"] = f"no Device of {node} read: devices shown by minor only"
    return out


def claims_story(ctx: Context) -> list[JSON]:
    out = []
    for claim in ctx.claims:
        meta, status = claim.get("metadata") or {}, claim.get("status") or {}
        entry: JSON = {"name": meta.get("name")}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
        if not results:
            entry["allocated"] = False
        else:
            entry["allocated"] = True
            entry["devices"] = [
                f"{r.get('request')}: {r.get('pool')}/{r.get('device')}"
                + ("" if r.get("driver") == dra.DRIVER else f" ({r.get('driver')})")
                for r in results
            ]
            entry["reservedFor"] = [u.get("name") for u in status.get("reservedFor") or []]
        out.append(entry)
    return out


def pin_story(pod: JSON) -> JSON:
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}).get("nodeSelectorTerms") or []  # fmt: skip
    nodes: set[str] = set()
    for term in required:
        for req in [*(term.get("matchFields") or []), *(term.get("matchExpressions") or [])]:
            if req.get("key") in ("metadata.name", "kubernetes.io/hostname") and req.get("operator") == "In":
                nodes.update(req.get("values") or [])
    out: JSON = {}
    if nodes:
        out["affinity"] = sorted(nodes)
    if status.get("nominatedNodeName"):
        out["nominated"] = status["nominatedNodeName"]
    if spec.get("nodeName"):
        out["boundTo"] = spec["nodeName"]
    return out


def event_rows(events: Sequence[JSON], now: float) -> list[JSON]:
    rows = []
    for e in sorted(events, key=event_time):
        count = e.get("count") or (e.get("series") or {}).get("count") or 1
        rows.append(
            {
                "ago": round(now - event_time(e)),
                "type": e.get("type", ""),
                "reason": e.get("reason", ""),
                "from": reporter(e),
                "message": " ".join(str(e.get("message") or e.get("note") or "").split()),
                "count": count,
            }
        )
    return rows


def story(pod: JSON, ctx: Context, now: float) -> JSON:
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    return {
        "pod": f"{meta.get('namespace')}/{meta.get('name')}",
        "uid": meta.get("uid", ""),
        "scheduler": spec.get("schedulerName") or "default-scheduler",
        "phase": status.get("phase", "Pending"),
        "node": spec.get("nodeName") or "",
        "gang": gang_story(pod, ctx),
        "allocation": allocation_story(pod, ctx),
        "claims": claims_story(ctx),
        "pin": pin_story(pod),
        "gates": [g.get("name") for g in spec.get("schedulingGates") or []],
        "conditions": [
            {k: c.get(k) for k in ("type", "status", "reason", "message") if c.get(k)}
            for c in conditions(pod).values()
        ],
        "waits": [w.as_data() for w in waits(pod, ctx.events)],
        "events": event_rows(ctx.events, now),
    }
