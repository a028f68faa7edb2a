"""What the Reservation controller asks the core when it places Reservations: the nodes a template
is let onto, a node and devices for one Reservation, one for every member of a gang of them at
once (inside one domain of the gang's topology level, as a gang of pods: docs/topology.md), and
(when the template's priority allows) the cheapest lower-priority pods to evict for it.
Pure decisions through the CoreAdapter; the controller carries them out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from allocator.core.gang.levels import Levels, levels_of
from allocator.core.gang.plan import GangPlan, GangPlanSettings, NoPlan
from allocator.core.gang.victims import Candidate
from allocator.core.reservation.place import NoRoom, RoomPlan
from allocator.reservations.book import Entry
from allocator.reservations.cache_view import ReservationCache
from allocator.runtime.cache.victims import all_candidates
from allocator.runtime.coreadapter import CoreAdapter, PodRequest
from apis.annotations import DeviceAllocations
from apis.errors import CodecError
from apis.tolerations import admits, tolerations_of
from apis.topology_constraint import TopologyWish, annotated_topology
from apis.topology_profile import TopologyProfile


@dataclass(frozen=True)
class Spot:
    """Where one Reservation goes: its node, devices and (SingleNUMANode) NUMA node."""

    name: str
    node: str
    devices: DeviceAllocations
    numa: int | None = None


@dataclass(frozen=True)
class Placing:
    spots: tuple[Spot, ...] = ()  # every member placed, or none
    victims: tuple[Candidate, ...] = ()  # to evict first (the spots wait for them)
    message: str = ""  # why nothing was placed
    unresolvable: bool = False


def admitting(cache: ReservationCache, core: CoreAdapter, entry: Entry) -> list[str]:
    """Nodes the template is let onto: its nodeName alone when set, else those whose taints and
    cordon its tolerations accept."""
    res = entry.res
    assert res is not None
    spec = res.template.get("spec") or {}
    pinned = spec.get("nodeName") if isinstance(spec, dict) else None
    if pinned:
        return [pinned] if core.has_node(pinned) else []
    tolerations = tolerations_of(res.template)
    return [
        name for name, facts in cache.nodes.items() if core.has_node(name) and admits(facts.spec, tolerations)
    ]


def place_one(core: CoreAdapter, entry: Entry, req: PodRequest, names: Sequence[str]) -> Placing:
    got = core.place_room(req, names)
    if isinstance(got, NoRoom):
        return Placing(message=got.message, unresolvable=got.unresolvable)
    assert isinstance(got, RoomPlan)
    return Placing((Spot(entry.name, got.node, got.allocation.devices, got.numa),))


@dataclass(frozen=True)
class GangTopology:
    """What a gang of Reservations keeps to: the profile's levels as the plan's topology keys (one
    domain preferred), the level its members ask for, and where members already holding room are."""

    keys: tuple[str, ...] = ()
    levels: Levels | None = None
    siblings: Mapping[str, int] | None = None  # node -> members holding room there


def gang_levels(members: Sequence[Entry], profile: TopologyProfile) -> Levels | None:
    """The level a gang of Reservations asks for: topoalloc's or Kueue's topology annotation on a
    member Reservation or its template (the Reservation's own wins), the first member (oldest) that
    states one (apis/topology_constraint.py). Raises CodecError naming the Reservation whose
    annotation is malformed."""
    first: TopologyWish | None = None
    for m in members:
        assert m.res is not None
        tmeta = m.res.template.get("metadata") or {}
        notes = {**(tmeta.get("annotations") or {}), **m.res.annotations}
        notes = {k: v for k, v in notes.items() if isinstance(v, str)}
        try:
            found = annotated_topology(notes, f"Reservation {m.name}")
        except CodecError as exc:
            raise CodecError(f"Reservation {m.name}: {exc.field}", exc.problem, exc.value) from None
        if first is None and found is not None:
            first = found
    return levels_of(profile, first)


def place_gang(
    core: CoreAdapter,
    members: Sequence[Entry],
    reqs: Sequence[PodRequest],
    names: Sequence[str],
    topology: GangTopology = GangTopology(),
) -> Placing:
    """Every member at once with the gang planner (fewest nodes, best topology, one domain; one
    domain of a required level or none placed)."""
    settings = GangPlanSettings(topology_keys=topology.keys, scoring=core.scoring.device_scoring)
    got = core.plan_gang(
        reqs, settings, siblings=topology.siblings or {}, names=names, levels=topology.levels
    )
    if isinstance(got, NoPlan):
        return Placing(message=got.message, unresolvable=got.unresolvable)
    return Placing(_spots(members, reqs, got))


def with_preemption(
    cache: ReservationCache,
    core: CoreAdapter,
    members: Sequence[Entry],
    reqs: Sequence[PodRequest],
    names: Sequence[str],
    topology: GangTopology = GangTopology(),
) -> Placing:
    """A placement for every member and the cheapest lower-priority pods (a gang of pods only
    whole) whose eviction makes room for it: the gang preemption machinery, keeping to the gang's
    topology level; victims a PodDisruptionBudget protects last, as for gangs of pods."""
    candidates = all_candidates(cache.pods, cache.ledger.holds, cache.budgets)
    settings = GangPlanSettings(topology_keys=topology.keys, scoring=core.scoring.device_scoring)
    got = core.plan_with_preemption(
        reqs,
        candidates,
        settings,
        names=names,
        siblings=topology.siblings or {},
        levels=topology.levels,
    )
    if isinstance(got, NoPlan):
        return Placing(message=got.message, unresolvable=got.unresolvable)
    return Placing(_spots(members, reqs, got.plan), got.victims)


def _spots(members: Sequence[Entry], reqs: Sequence[PodRequest], plan: GangPlan) -> tuple[Spot, ...]:
    by_key = {req.key: entry.name for entry, req in zip(members, reqs, strict=True)}
    return tuple(Spot(by_key[p.key], p.node, p.allocation.devices) for p in plan.placements)
