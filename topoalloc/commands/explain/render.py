"""`topoalloc explain pod` as people read it: one section per part of the story, the reasons it
waits first."""

from __future__ import annotations

from typing import Any

from topoalloc.output import ago

JSON = dict[str, Any]
INDENT = "  "


def _device_line(row: JSON) -> str:
    parts = [f"{row['type']} {row['minor']}"]
    if row.get("id"):
        parts.append(str(row["id"]))
    if "numa" in row:
        parts.append(f"NUMA {row['numa']}")
    if row.get("pcieSwitch"):
        parts.append(f"PCIe switch {row['pcieSwitch']}")
    if row.get("nvlinkDomain"):
        parts.append(f"NVLink domain {row['nvlinkDomain']}")
    if row.get("vfs"):
        parts.append(f"VFs {', '.join(row['vfs'])}")
    if row.get("resources"):
        parts.append(", ".join(f"{k}={v}" for k, v in row["resources"].items()))
    if row.get("healthy") is False:
        parts.append("UNHEALTHY")
    return INDENT + "; ".join(parts)


def _where(data: JSON) -> str:
    if data["node"]:
        return f"bound to {data['node']}, {data['phase']}"
    return f"not bound, {data['phase']}"


def render(data: JSON, now: float) -> str:
    lines = [f"pod {data['pod']} (scheduler {data['scheduler']}): {_where(data)}"]
    waits = data["waits"]
    lines.append("waits for:" if waits else "waits for: nothing topoalloc knows of")
    for w in waits:
        since = f" ({ago(now - w['since'])})" if w.get("since") is not None else ""
        lines.append(f"{INDENT}{w['what']}{since}: {w['how']}")
        if w["why"]:
            lines.append(f"{INDENT * 2}why not yet: {w['why']}")
    gang = data["gang"]
    if gang is None:
        lines.append("gang: none")
    elif "error" in gang:
        lines.append(f"gang: the pod names its gang wrongly: {gang['error']}")
    else:
        size = f", minimum {gang['minMember']}" if "minMember" in gang else ""
        phase = f", phase {gang['phase']}" if gang.get("phase") else ""
        lines.append(
            f"gang: {gang['name']} ({gang['source']}{size}{phase}): {gang.get('object', 'no object')}"
        )
        lines += [f"{INDENT}{c}" for c in gang.get("conditions", [])]
        lines.append(f"{INDENT}members: {', '.join(gang['members']) or 'none found'}")
    alloc = data["allocation"]
    if alloc is None:
        lines.append("allocation: none recorded (no device-allocated annotation)")
    else:
        lines.append(f"allocation: made for {alloc['node']} ({alloc['annotation']})")
        for key in ("error", "note", "deviceNote"):
            if alloc.get(key):
                lines.append(f"{INDENT}{alloc[key]}")
        lines += [_device_line(row) for row in alloc.get("devices", [])]
        if alloc.get("links"):
            lines.append(f"{INDENT}links: {', '.join(alloc['links'])}")
    for claim in data["claims"]:
        if claim["allocated"]:
            users = ", ".join(claim["reservedFor"]) or "no pod"
            lines.append(f"claim {claim['name']}: {'; '.join(claim['devices'])} (reserved for {users})")
        else:
            lines.append(f"claim {claim['name']}: not allocated")
    pin = data["pin"]
    said = []
    if pin.get("affinity"):
        said.append(f"required node affinity to {', '.join(pin['affinity'])}")
    if pin.get("nominated"):
        said.append(f"nominated to {pin['nominated']}")
    lines.append(f"pin: {'; '.join(said) or 'none'}")
    lines.append(f"gates: {', '.join(data['gates']) or 'none'}")
    for c in data["conditions"]:
        reason = f" {c['reason']}" if c.get("reason") else ""
        message = f": {c['message']}" if c.get("message") else ""
        lines.append(f"condition {c['type']}={c.get('status')}{reason}{message}")
    lines.append("events:" if data["events"] else "events: none")
    for e in data["events"]:
        count = f" (x{e['count']})" if e["count"] and e["count"] > 1 else ""
        when = f"{ago(e['ago']):>5} ago"
        lines.append(f"{INDENT}{when}  {e['type']:<7} {e['reason']:<22} {e['from']}: {e['message']}{count}")
    return "\n".join(lines) + "\n"
