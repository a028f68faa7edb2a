"""The migration controller's inputs read from the watch cache: the running pods' facts, the work
waiting long enough (gangs by their members, GPU pods alone), and the moves in flight read back
from the Reservations the controller made (labelled `topoalloc.io/defrag`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from allocator.core.defrag.inputs import PodFacts, Waiter
from allocator.core.defrag.migration import Migration
from allocator.core.gang.priority import by_priority, gang_priority
from allocator.defrag.cache_view import DefragCache
from allocator.runtime.coreadapter import CoreAdapter
from apis import keys
from apis import resources as rn
from apis.selector import LabelSelector
from apis.timestamps import parse_time

JSON = dict[str, Any]
LABEL = keys.TOPOALLOC + "defrag"
POD = keys.TOPOALLOC + "defrag-pod"
POD_UID = keys.TOPOALLOC + "defrag-pod-uid"
SOURCE = keys.TOPOALLOC + "defrag-source"
TARGET = keys.TOPOALLOC + "defrag-target"
WORKLOAD = keys.TOPOALLOC + "defrag-workload"
UNBLOCKS = keys.TOPOALLOC + "defrag-unblocks"
EVICTED = keys.TOPOALLOC + "defrag-evicted"
CLOSED = keys.TOPOALLOC + "defrag-closed"


def controller_of(raw: Mapping[str, Any]) -> tuple[str, str]:
    """(kind, "namespace/Kind/name") of the pod's controller; ("", "") for a bare pod."""
    meta = raw.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller"):
            kind = str(ref.get("kind", ""))
            return kind, f"{meta.get('namespace') or 'default'}/{kind}/{ref.get('name', '')}"
    return "", ""


def protected_keys(pods: Mapping[str, JSON], budgets: Iterable[JSON]) -> set[str]:
    """Pods (by key, their objects) a PodDisruptionBudget allowing no disruption now selects."""
    out: set[str] = set()
    for pdb in budgets:
        if (pdb.get("status") or {}).get("disruptionsAllowed", 0) > 0:
            continue
        namespace = (pdb.get("metadata") or {}).get("namespace") or "default"
        try:
            selector = LabelSelector.from_dict((pdb.get("spec") or {}).get("selector") or {}, "selector")
        except ValueError:
            continue
        for key, raw in pods.items():
            meta = raw.get("metadata") or {}
            if key.startswith(namespace + "/") and selector.matches(meta.get("labels") or {}):
                out.add(key)
    return out


def pod_facts(
    cache: DefragCache, core: CoreAdapter, running: Mapping[str, JSON], protected: set[str], now: float
) -> list[PodFacts]:
    """`running`: the bound pods' objects by key, listed from the API (the cache keeps only what a
    bound pod holds, not its owners, labels or start time). A pod not started yet (no
    `status.startTime`) has no work to lose."""
    out = []
    for key, e in cache.pods.items():
        raw = running.get(key)
        if not e.holds or e.deleting or raw is None or e.usage is None or raw["metadata"].get("uid") != e.uid:
            continue
        allocations = e.usage.allocations
        gpus = len(allocations.minors(rn.DeviceType.GPU)) if allocations is not None else 0
        if not gpus:
            continue
        kind, workload = controller_of(raw)
        started = parse_time((raw.get("status") or {}).get("startTime")) or now
        out.append(
            PodFacts(
                key, e.node, e.priority, core.request(raw), gpus, kind, workload, e.gang,
                key in protected, started, e.uid,
            )
        )  # fmt: skip
    return out


def waiters(
    cache: DefragCache, core: CoreAdapter, now: float, min_wait: float, busy: set[str]
) -> list[Waiter]:
    """Pending GPU work waiting at least `min_wait` seconds, in queue order; `busy`: waiters with
    moves in flight (planned again only once those are done)."""
    gangs: dict[str, list[Any]] = {}
    lone = []
    for e in cache.pods.values():
        if e.node or not e.active or e.deleting or e.raw is None:
            continue
        created = parse_time((e.raw.get("metadata") or {}).get("creationTimestamp"))
        if created is None or now - created < min_wait:
            continue
        if e.gang:
            gangs.setdefault(e.gang, []).append(e)
        else:
            lone.append(e)
    out: list[tuple[Waiter, float]] = []
    for gang, members in gangs.items():
        reqs = tuple(core.request(m.raw) for m in sorted(members, key=lambda m: m.key))
        if any(r.wants_devices for r in reqs):
            since = min(parse_time(m.raw["metadata"].get("creationTimestamp")) or 0.0 for m in members)
            out.append((Waiter(f"gang {gang}", reqs, gang_priority(r.priority for r in reqs)), since))
    for e in lone:
        req = core.request(e.raw)
        if req.gpu is not None and req.invalid is None:
            since = parse_time(e.raw["metadata"].get("creationTimestamp")) or 0.0
            out.append((Waiter(f"pod {e.key}", (req,), req.priority), since))
    out = [w for w in out if w[0].name not in busy]
    ordered = by_priority(out, lambda w: w[0].priority, lambda w: w[1], lambda w: w[0].name)
    return [w for w, _ in ordered]


def migrations(cache: DefragCache) -> list[tuple[Migration, str, str]]:
    """(the move in flight, its Reservation's uid, the waiter it unblocks) per Reservation made."""
    out = []
    for name, raw in cache.reservations.items():
        meta = raw.get("metadata") or {}
        if (meta.get("labels") or {}).get(LABEL) != "true":
            continue
        notes = meta.get("annotations") or {}
        key, uid = notes.get(POD, ""), notes.get(POD_UID, "")
        entry = cache.pods.get(key)
        present = entry is not None and entry.uid == uid and entry.active and not entry.deleting
        m = Migration(
            name, key, uid, notes.get(WORKLOAD, ""), notes.get(SOURCE, ""), notes.get(TARGET, ""),
            str((raw.get("status") or {}).get("phase") or ""),
            parse_time(meta.get("creationTimestamp")) or 0.0,
            notes.get(EVICTED) == "true", present, bool(notes.get(CLOSED)),
        )  # fmt: skip
        out.append((m, str(meta.get("uid", "")), notes.get(UNBLOCKS, "")))
    return out
