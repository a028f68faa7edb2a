"""The migration controller's inputs read from the watch cache, no LIST: the running pods' facts
(their outlines, owners, start times and the budgets selecting them), the work waiting long
enough (gangs by their members, GPU pods alone), the moves in flight read back from the
Reservations the controller made (labelled `topoalloc.io/defrag`), and each workload's pods
available now."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from allocator.core.defrag.inputs import PodFacts, Waiter
from allocator.core.defrag.migration import Migration
from allocator.core.gang.priority import by_priority, gang_priority
from allocator.defrag.cache_view import DefragCache
from allocator.runtime.cache.records import PodEntry, outline_pod
from allocator.runtime.coreadapter import CoreAdapter
from apis import keys
from apis import resources as rn
from apis.errors import CodecError
from apis.reservation import Reservation
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


def workload_of(entry: PodEntry) -> tuple[str, str]:
    """(kind, "namespace/Kind/name") of the pod's controller; ("", "") for a bare pod."""
    if not entry.owner:
        return "", ""
    kind = entry.owner.partition("/")[0]
    return kind, f"{entry.key.partition('/')[0]}/{entry.owner}"


def budgets_of(cache: DefragCache, entry: PodEntry) -> tuple[tuple[str, int], ...]:
    """(budget, disruptions it allows now) of every PodDisruptionBudget selecting the pod."""
    return cache.budgets.selecting(entry.key.partition("/")[0], entry.labels)


def pod_facts(
    cache: DefragCache, core: CoreAdapter, now: float, *, budgets_read: bool = True
) -> list[PodFacts]:
    """Every bound pod holding GPUs, as the planner weighs it. A pod not started yet (no
    `status.startTime`) has no work to lose; one a budget allowing no disruption selects is
    protected (every pod is, when the budgets could not be read: a move must never break one)."""
    out = []
    for key, e in cache.pods.items():
        if not e.holds or e.deleting or e.usage is None:
            continue
        allocations = e.usage.allocations
        gpus = len(allocations.minors(rn.DeviceType.GPU)) if allocations is not None else 0
        pod = outline_pod(e) if gpus else None
        if pod is None:
            continue
        kind, workload = workload_of(e)
        started = parse_time(e.started) or now
        protected = not budgets_read or any(n <= 0 for _, n in budgets_of(cache, e))
        out.append(
            PodFacts(
                key, e.node, e.priority, core.request(pod), gpus, kind, workload, e.gang, protected,
                started, e.uid,
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


@dataclass(frozen=True)
class InFlight:
    """A move as its Reservation tells it: the move, the Reservation's uid, the waiter it
    unblocks, and the pods that took its room (`currentOwners`: its replacement)."""

    migration: Migration
    uid: str
    waiter: str
    replacements: tuple[str, ...] = ()


def migrations(cache: DefragCache) -> list[InFlight]:
    """Every move the controller made, read back from its Reservation."""
    out = []
    for name, raw in cache.reservations.items():
        meta = raw.get("metadata") or {}
        if (meta.get("labels") or {}).get(LABEL) != "true":
            continue
        notes = meta.get("annotations") or {}
        key, uid = notes.get(POD, ""), notes.get(POD_UID, "")
        entry = cache.pods.get(key)
        present = entry is not None and entry.uid == uid and entry.active and not entry.deleting
        status = raw.get("status") or {}
        owners = _owners(status)
        room = str(status.get("nodeName") or notes.get(TARGET, ""))
        m = Migration(
            name, key, uid, notes.get(WORKLOAD, ""), notes.get(SOURCE, ""), notes.get(TARGET, ""),
            str(status.get("phase") or ""), parse_time(meta.get("creationTimestamp")) or 0.0,
            notes.get(EVICTED) == "true", present, bool(notes.get(CLOSED)),
            ready=_running_ready(cache, owners, room), expires=_expires(raw),
        )  # fmt: skip
        out.append(
            InFlight(m, str(meta.get("uid", "")), notes.get(UNBLOCKS, ""), tuple(k for k, _ in owners))
        )
    return out


def ready_pods(cache: DefragCache, workloads: Iterable[str]) -> dict[str, int]:
    """Per workload, its pods available now: bound, Ready and not on their way out."""
    wanted = set(workloads)
    out: Counter[str] = Counter()
    if not wanted:
        return {}
    for e in cache.pods.values():
        if e.owner and e.holds and e.ready and not e.deleting:
            _, workload = workload_of(e)
            if workload in wanted:
                out[workload] += 1
    return dict(out)


def _owners(status: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(key, uid) of each pod the room went to."""
    refs = status.get("currentOwners") or []
    return [
        (f"{r.get('namespace') or 'default'}/{r.get('name', '')}", str(r.get("uid") or ""))
        for r in refs
        if isinstance(r, dict)
    ]


def _running_ready(cache: DefragCache, owners: list[tuple[str, str]], node: str) -> bool:
    """Some pod that took the room is that pod still, bound on the room's node and Ready."""
    for key, uid in owners:
        e = cache.pods.get(key)
        if e is not None and (not uid or e.uid == uid) and e.holds and e.node == node and e.ready:
            return True
    return False


def _expires(raw: JSON) -> float:
    """When the room expires (spec.expires, else creation + ttl); never, when it says nothing."""
    try:
        return Reservation.from_dict(raw).expiry()
    except (CodecError, ValueError, TypeError):
        return float("inf")
