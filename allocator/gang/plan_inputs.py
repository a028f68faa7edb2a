"""What the gang controller reads from the watch cache: one gang's view for the core's lifecycle
step (members, PodGroup, size, timeout, what the hold ledger holds for its members), and what the
planner (gang/planner.py) hands the core's gang planner: the members' requests, the nodes every
member tolerates, and where their siblings already are."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from typing import Any

from allocator.core.claims.gang import pinned
from allocator.core.gang.view import Gang, MemberPod, Outcomes
from allocator.gang.cache_view import GangCache
from allocator.gang.index import GangIndex
from allocator.gang.timefmt import parse_duration
from allocator.runtime.cache.dra import ClaimEntry
from allocator.runtime.coreadapter import CoreAdapter, PodRequest
from allocator.runtime.gang_settings import GangSettings
from allocator.runtime.taints import admits, tolerations_of
from allocator.runtime.topology import Topology
from apis import keys
from apis import podgroup as pg
from apis.dra_claims import claim_name, pod_claims
from apis.errors import CodecError
from apis.gang_object import GangObject, read_gang_object
from apis.podgroup import GangRef

JSON = dict[str, Any]


def member_requests(cache: GangCache, core: CoreAdapter, members: list[MemberPod]) -> list[PodRequest]:
    """The parsed request of each member the cache has in the version the index saw; a member whose
    ResourceClaims are allocated held to their node (kube-scheduler only binds it there)."""
    out = []
    for m in members:
        entry = cache.pods.get(m.key)
        if entry is not None and entry.raw is not None and entry.uid == m.uid:
            req = core.request(entry.raw)
            node = claims_node(entry.raw, cache.dra.claims)
            out.append(pinned(req, node) if node else req)
    return out


def claims_node(pod: JSON, claims: Mapping[str, ClaimEntry]) -> str:
    """The node the pod's allocated ResourceClaims hold it to ("" for none)."""
    namespace = (pod.get("metadata") or {}).get("namespace") or "default"
    try:
        refs = pod_claims(pod)
    except CodecError:
        return ""
    for ref in refs:
        name = claim_name(ref)
        entry = claims.get(f"{namespace}/{name}") if name else None
        allocation = entry.claim.allocation if entry is not None and entry.claim is not None else None
        if allocation is not None and allocation.node:
            return allocation.node
    return ""


def admitting_nodes(cache: GangCache, core: CoreAdapter, members: list[MemberPod]) -> list[str]:
    """Nodes whose taints and cordon every one of the members tolerates."""
    kinds: dict[str, list[JSON]] = {}
    for m in members:
        entry = cache.pods.get(m.key)
        tolerations = tolerations_of(entry.raw) if entry is not None and entry.raw is not None else []
        kinds[json.dumps(tolerations, sort_keys=True)] = tolerations
    return [
        name
        for name, facts in cache.nodes.items()
        if core.has_node(name) and all(admits(facts.spec, t) for t in kinds.values())
    ]


def sibling_nodes(core: CoreAdapter, index: GangIndex, gang: str, members: list[MemberPod]) -> dict[str, int]:
    """node -> how many siblings of the members (their gang `gang`, their job groups), the
    members themselves left out, hold or reserve room there."""
    where = core.pod_nodes
    keys_ = set()
    for m in members:
        keys_ |= set(index.siblings(m.key, gang, m.job_key))
    keys_ -= {m.key for m in members}
    return dict(Counter(n for n in (where.get(k) for k in keys_) if n))


def gang_view(
    index: GangIndex,
    cache: GangCache,
    settings: GangSettings,
    key: str,
    outcomes: Outcomes | None = None,
    last: GangRef | None = None,
    topology: Topology | None = None,
) -> Gang:
    """One gang as a pass sees it: members for the schedulers we serve, the object that defines it
    (or why it has none usable), its size and its timeout, the uid the hold ledger holds each
    member for, the topology levels it keeps to (with `topology`), and what became of the writes
    made for it last pass (`outcomes`). `last` is how its members named it before they all left
    (its object is still read once more: a timed-out gang's status goes back to Pending)."""
    names = settings.scheduler_names
    members = [m for m in index.members(key) if not names or m.scheduler in names]
    namespace, _, name = key.partition("/")
    ref = index.ref(key) or last or GangRef(namespace, name, pg.PODGROUP_SOURCE)
    source = ref.source
    found, raw, problem = _object_of(cache, ref)
    if found is not None and found.source == pg.PODGROUP_SOURCE:
        min_member, timeout = found.min_member, found.timeout  # scheduleTimeoutSeconds, or none
    elif found is not None:  # the native API has no timeout field
        min_member, timeout = found.min_member, _waiting_time(found.annotations, members)
    else:
        min_member, timeout = max(1, ref.min_available or 1), _waiting_time({}, members)
    if timeout is None:
        timeout = settings.default_timeout
    held = cache.ledger.holds
    holds = {m.key: res.uid for m in members if (res := held.get(m.key)) is not None}
    where = ref.object_key if raw is not None else key
    native = ref.source == pg.NATIVE_SOURCE
    levels, why = (
        topology.levels_or_problem(members, raw, where, native=native) if topology is not None else (None, "")
    )
    code = "InvalidTopology" if why and not problem else "InvalidPodGroup"
    return Gang(
        key, namespace, name, source, found, problem or why, min_member, float(timeout), members,
        holds, index.generation, outcomes or Outcomes(), levels, code,
    )  # fmt: skip


def _object_of(cache: GangCache, ref: GangRef) -> tuple[GangObject | None, JSON | None, str]:
    stores = {
        pg.PODGROUP_SOURCE: cache.podgroups,
        pg.NATIVE_SOURCE: cache.native_podgroups,
        pg.WORKLOAD_SOURCE: cache.workloads,
    }
    return read_gang_object(ref, stores)


def _waiting_time(annotations: Mapping[str, str], members: list[MemberPod]) -> float | None:
    """The gang's waiting-time annotation (Koordinator's key, a Go duration): on its object first
    (a native PodGroup or Workload, which have no timeout field), else on a member."""
    found = [annotations.get(keys.GANG_WAITING_TIME)]
    found += [m.annotations.get(keys.GANG_WAITING_TIME) for m in members]
    for raw in found:
        if raw is not None and (seconds := parse_duration(raw)) is not None:
            return seconds
    return None
