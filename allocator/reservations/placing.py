"""What the Reservation controller asks the core when it places Reservations: the nodes a template
is let onto, a node and devices for one Reservation, one for every member of a gang of them at
once, and (when the template's priority allows) the cheapest lower-priority pods to evict for it.
Pure decisions through the CoreAdapter; the controller carries them out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from allocator.core.gang.plan import GangPlan, NoPlan, PlanSettings
from allocator.core.gang.victims import Candidate
from allocator.core.reservation.place import NoRoom, RoomPlan
from allocator.reservations.book import Entry
from allocator.reservations.cache_view import ReservationCache
from allocator.runtime.cache.victims import all_candidates
from allocator.runtime.coreadapter import CoreAdapter, PodRequest
from apis.annotations import DeviceAllocations
from apis.tolerations import admits, tolerations_of


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
        name
        for name, (_, _, nspec) in cache.nodes.items()
        if core.has_node(name) and admits(nspec, tolerations)
    ]


def place_one(core: CoreAdapter, entry: Entry, req: PodRequest, names: Sequence[str]) -> Placing:
    got = core.place_room(req, names)
    if isinstance(got, NoRoom):
        return Placing(message=got.message, unresolvable=got.unresolvable)
    assert isinstance(got, RoomPlan)
    return Placing((Spot(entry.name, got.node, got.allocation.devices, got.numa),))


def place_gang(
    core: CoreAdapter, members: Sequence[Entry], reqs: Sequence[PodRequest], names: Sequence[str]
) -> Placing:
    """Every member at once with the gang planner (fewest nodes, best topology, one domain)."""
    settings = PlanSettings(scoring=core.scoring.device_scoring)
    got = core.plan_gang(reqs, settings, siblings={}, names=names)
    if isinstance(got, NoPlan):
        return Placing(message=got.message, unresolvable=got.unresolvable)
    return Placing(_spots(members, reqs, got))


def with_preemption(
    cache: ReservationCache,
    core: CoreAdapter,
    members: Sequence[Entry],
    reqs: Sequence[PodRequest],
    names: Sequence[str],
) -> Placing:
    """A placement for every member and the cheapest lower-priority pods (a gang of pods only
    whole) whose eviction makes room for it: the gang preemption machinery."""
    candidates = all_candidates(cache.pods, cache.ledger.reservations)
    settings = PlanSettings(scoring=core.scoring.device_scoring)
    got = core.plan_with_preemption(reqs, candidates, settings, names=names, siblings={})
    if isinstance(got, NoPlan):
        return Placing(message=got.message, unresolvable=got.unresolvable)
    return Placing(_spots(members, reqs, got.plan), got.victims)


def _spots(members: Sequence[Entry], reqs: Sequence[PodRequest], plan: GangPlan) -> tuple[Spot, ...]:
    by_key = {req.key: entry.name for entry, req in zip(members, reqs, strict=True)}
    return tuple(Spot(by_key[p.key], p.node, p.allocation.devices) for p in plan.placements)
