"""What the gang controller reads from the watch cache: one gang's view for the core's lifecycle
step (members, PodGroup, size, timeout, what the hold ledger holds for its members), and what the
planner (gang/planner.py) hands the core's gang planner: the members' requests, the nodes every
member tolerates, and where their siblings already are."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from allocator.core.gang.view import Gang, MemberPod, Outcomes
from allocator.gang.cache_view import GangCache
from allocator.gang.index import GangIndex
from allocator.gang.timefmt import parse_duration
from allocator.gang.topology import Topology
from allocator.runtime.coreadapter import CoreAdapter, PodRequest
from allocator.runtime.gang_settings import GangSettings
from allocator.runtime.taints import admits, tolerations_of
from apis import keys
from apis import podgroup as pg
from apis.errors import CodecError

JSON = dict[str, Any]


def member_requests(cache: GangCache, core: CoreAdapter, members: list[MemberPod]) -> list[PodRequest]:
    """The parsed request of each member the cache has in the version the index saw."""
    out = []
    for m in members:
        entry = cache.pods.get(m.key)
        if entry is not None and entry.raw is not None and entry.uid == m.uid:
            out.append(core.request(entry.raw))
    return out


def admitting_nodes(cache: GangCache, core: CoreAdapter, members: list[MemberPod]) -> list[str]:
    """Nodes whose taints and cordon every one of the members tolerates."""
    kinds: dict[str, list[JSON]] = {}
    for m in members:
        entry = cache.pods.get(m.key)
        tolerations = tolerations_of(entry.raw) if entry is not None and entry.raw is not None else []
        kinds[json.dumps(tolerations, sort_keys=True)] = tolerations
    return [
        name
        for name, (_, _, spec) in cache.nodes.items()
        if core.has_node(name) and all(admits(spec, t) for t in kinds.values())
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
    topology: Topology | None = None,
) -> Gang:
    """One gang as a pass sees it: members for the schedulers we serve, its PodGroup (or why it
    has none usable), its size and its timeout, the uid the hold ledger holds each member for, the
    topology levels it keeps to (with `topology`), and what became of the writes made for it last
    pass (`outcomes`)."""
    names = settings.scheduler_names
    members = [m for m in index.members(key) if not names or m.scheduler in names]
    ref = index.ref(key)
    namespace, _, name = key.partition("/")
    source = ref.source if ref is not None else "podgroup"
    group: pg.PodGroup | None = None
    problem = ""
    raw = None
    if source != "koordinator":
        raw = cache.podgroups.get(key)
        if raw is None:
            problem = f"PodGroup {key} does not exist"
        else:
            try:
                group = pg.PodGroup.from_dict(raw)
            except CodecError as exc:
                problem = f"PodGroup {key} is invalid: {exc}"
    if group is not None:
        min_member = max(1, group.min_member)
        timeout = group.schedule_timeout_seconds
    else:
        min_member = max(1, (ref.min_available if ref is not None else None) or 1)
        timeout = _waiting_time(members)
    if timeout is None:
        timeout = settings.default_timeout
    held = cache.ledger.reservations
    holds = {m.key: res.uid for m in members if (res := held.get(m.key)) is not None}
    levels, why = topology.levels_or_problem(members, raw, key) if topology is not None else (None, "")
    code = "InvalidTopology" if why and not problem else "InvalidPodGroup"
    return Gang(
        key, namespace, name, source, group, problem or why, min_member, float(timeout), members,
        holds, index.generation, outcomes or Outcomes(), levels, code,
    )  # fmt: skip


def _waiting_time(members: list[MemberPod]) -> float | None:
    for m in members:
        raw = m.annotations.get(keys.GANG_WAITING_TIME)
        if raw is not None and (seconds := parse_duration(raw)) is not None:
            return seconds
    return None
