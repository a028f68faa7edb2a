"""What `topoalloc defrag` prints: per node its GPUs, free GPUs (its free block) and NVLink
partitions wholly free; the cluster's largest free block; the plan (each move, what it unblocks,
its cost in GPU-hours); what the controller would do next within its limits; and with
`--explain` each waiter's candidate pods and why each may or may not move."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from allocator.core.actions import Event, Evict
from allocator.core.defrag.blocks import fragmentation, partitions_free
from allocator.core.defrag.inputs import Waiter, why_immovable
from allocator.core.defrag.migration import (
    HELD,
    CloseReservation,
    CreateReservation,
    Limits,
    Migration,
    held_why,
    step,
)
from allocator.core.node.gpu_summary import GPUSummary
from allocator.core.node.state import NodeState
from allocator.defrag.planning import Pass
from allocator.defrag.report import report
from allocator.runtime.defrag_settings import DefragSettings

JSON = dict[str, Any]


@dataclass
class Snapshot:
    nodes: Mapping[str, NodeState]
    got: Pass
    limits: Limits
    settings: DefragSettings
    now: float
    rooms: int  # Available Reservations whose rooms count as taken


def node_rows(nodes: Mapping[str, NodeState]) -> list[JSON]:
    rows = []
    for name in sorted(nodes):
        summary = GPUSummary.of(nodes[name])
        if not summary.healthy_count:
            continue
        parts = partitions_free(nodes[name])
        rows.append(
            {
                "node": name,
                "gpus": summary.healthy_count,
                "freeGPUs": summary.whole_free,
                "partitionsFree": {str(size): count for size, count in parts},
            }
        )
    return rows


def next_steps(snap: Snapshot) -> list[JSON]:
    """What the controller would do now if enabled and not a dry run (limits applied)."""
    got = snap.got
    out: list[JSON] = []
    for action in step(got.migrations, got.plan, snap.limits, snap.now, dry_run=False, caps=got.caps):
        match action:
            case CreateReservation(move):
                out.append({"step": "reserve", "pod": move.key, "on": move.target})
            case Event(target, _, reason, note) if reason == HELD:
                out.append({"step": "hold", "pod": target.key, "why": held_why(note)})
            case Evict(pod, _, room):
                out.append({"step": "evict", "pod": pod.key, "room": room})
            case CloseReservation(migration, reason):
                out.append({"step": "close", "room": migration.reservation, "why": reason})
    return out


def _gpus(w: Waiter) -> int:
    return sum(r.gpu.count for r in w.members if r.gpu is not None)


def explain(snap: Snapshot) -> list[JSON]:
    """Per waiter, in queue order: its outcome and every candidate pod's verdict for it."""
    got = snap.got
    plan = got.plan
    moves = {m.key: m for m in plan.moves}
    stuck = dict(plan.stuck)
    unblocked = {u.waiter: u for u in plan.unblocked}
    out = []
    for w in got.waiters:
        if w.name in plan.fits:
            outcome = "fits without a move"
        elif w.name in unblocked:
            u = unblocked[w.name]
            outcome = f"unblocked by {len(u.moves)} move(s)" + ("" if u.exact else " (not proven cheapest)")
        else:
            outcome = f"stuck: {stuck.get(w.name, 'not planned')}"
        pods = []
        for f in sorted(got.facts, key=lambda f: (f.node, f.key)):
            why = why_immovable(f, w.priority, got.options)
            entry: JSON = {"pod": f.key, "node": f.node, "gpus": f.gpus, "priority": f.priority}
            entry["movable"] = not why
            if why:
                entry["why"] = why
            move = moves.get(f.key)
            if move is not None and move.unblocks == w.name:
                entry["move"] = {"to": move.target, "gpuHoursLost": round(move.gpu_hours, 3)}
            pods.append(entry)
        out.append(
            {"waiter": w.name, "gpus": _gpus(w), "priority": w.priority, "outcome": outcome, "pods": pods}
        )
    return out


def as_data(snap: Snapshot, *, explain_too: bool = False) -> JSON:
    frag = fragmentation(snap.nodes)
    data: JSON = {
        "fragmentation": {
            "gpus": frag.gpus,
            "freeGPUs": frag.free,
            "largestFreeBlock": frag.largest_block,
            "nodesWhollyFree": frag.nodes_free,
            "gpuNodes": frag.gpu_nodes,
            "reservedRooms": snap.rooms,
        },
        "nodes": node_rows(snap.nodes),
        "plan": report(snap.got.plan, snap.now),
        "inFlight": [_in_flight(f.migration, f.waiter, snap.now) for f in snap.got.inflight],
        "next": next_steps(snap),
        "settings": {"dryRun": snap.settings.dry_run, "enabled": snap.settings.enabled},
    }
    if not snap.got.budgets_read:
        data["warning"] = "PodDisruptionBudgets could not be read: every pod counts as protected"
    if explain_too:
        data["explain"] = explain(snap)
    return data


def _in_flight(m: Migration, waiter: str, now: float) -> JSON:
    return {
        "pod": m.pod,
        "from": m.source,
        "to": m.target,
        "room": m.reservation,
        "phase": m.phase,
        "evicted": m.evicted,
        "finished": m.finished(now),
        "unblocks": waiter,
    }


def render(snap: Snapshot, *, explain: bool = False) -> str:
    data = as_data(snap, explain_too=explain)
    f = data["fragmentation"]
    lines = [
        f"{f['gpuNodes']} GPU nodes, {f['gpus']} GPUs, {f['freeGPUs']} free; largest free block "
        f"{f['largestFreeBlock']} GPUs; {f['nodesWhollyFree']} nodes wholly free"
        + (f"; {f['reservedRooms']} reserved rooms counted as taken" if f["reservedRooms"] else ""),
        "",
        f"{'NODE':<28} {'GPUS':>4} {'FREE':>4}  NVLINK PARTITIONS FREE (GPUs:count)",
    ]
    for row in data["nodes"]:
        parts = " ".join(f"{size}:{count}" for size, count in row["partitionsFree"].items()) or "-"
        lines.append(f"{row['node']:<28} {row['gpus']:>4} {row['freeGPUs']:>4}  {parts}")
    plan = data["plan"]
    block = plan["largestFreeBlock"]
    lost = sum(m["gpuHoursLost"] for m in plan["moves"])
    lines += ["", f"plan: {len(plan['moves'])} move(s), largest free block {block['before']} -> "
              f"{block['after']}, {lost:.2f} GPU-hours of work lost"]  # fmt: skip
    for m in plan["moves"]:
        lines.append(
            f"  move {m['pod']} ({m['gpus']} GPU) {m['from']} -> {m['to']} for {m['unblocks']}"
            f" (lost {m['gpuHoursLost']:.2f} GPU-hours)"
        )
    for u in plan["unblocked"]:
        cheapest = "cheapest" if u["cheapest"] else "inclusion-minimal"
        lines.append(f"  unblocks {u['waiter']} with {len(u['moves'])} move(s) ({cheapest})")
    lines += [f"  fits already: {w}" for w in plan["fitWithoutMoves"]]
    lines += [f"  stuck: {s['waiter']}: {s['why']}" for s in plan["stuck"]]
    if data["inFlight"]:
        lines += ["", "moves in flight:"]
        for m in data["inFlight"]:
            state = "done" if m["finished"] else "evicted" if m["evicted"] else m["phase"] or "new"
            lines.append(f"  {m['pod']} {m['from']} -> {m['to']} ({m['room']}: {state}) for {m['unblocks']}")
    mode = "off" if not data["settings"]["enabled"] else "dry run" if data["settings"]["dryRun"] else "on"
    lines += ["", f"next steps were it on (defrag in these settings: {mode}):"]
    lines += [f"  {_step_line(s)}" for s in data["next"]] or ["  none"]
    if "warning" in data:
        lines += ["", f"warning: {data['warning']}"]
    if explain:
        for w in data["explain"]:
            lines += ["", f"{w['waiter']} ({w['gpus']} GPUs, priority {w['priority']}): {w['outcome']}"]
            for p in w["pods"]:
                verdict = "movable" if p["movable"] else f"stays: {p['why']}"
                if "move" in p:
                    mv = p["move"]
                    verdict = f"moves to {mv['to']} (lost {mv['gpuHoursLost']:.2f} GPU-hours)"
                lines.append(
                    f"  {p['pod']} on {p['node']} ({p['gpus']} GPU, priority {p['priority']}): {verdict}"
                )
    return "\n".join(lines) + "\n"


def _step_line(s: JSON) -> str:
    if s["step"] == "reserve":
        return f"reserve room on {s['on']} for {s['pod']}"
    if s["step"] == "hold":
        return f"hold {s['pod']}: {s['why']}"
    if s["step"] == "evict":
        return f"evict {s['pod']} (room {s['room']} Available)"
    return f"close {s['room']} ({s['why']})"
