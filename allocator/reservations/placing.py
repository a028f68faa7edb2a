"""The Reservation lifecycle's door to the cluster (allocator/core/reservation/door.py): the nodes a
template is let onto, a node and devices for one Reservation, one for every member of a gang of them
at once (inside one domain of the gang's topology level, as a gang of pods: docs/topology.md), the
cheapest lower-priority pods to evict for them, the book's rooms held and given back at once, and,
for freed room, the pods kube-scheduler holds back and whether one would pass the filter now.
The core decides through the CoreAdapter; the book and the watch cache answer the rest."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from allocator.core.gang.plan import GangPlan, GangPlanSettings, NoPlan
from allocator.core.reservation.door import GangTopology, Placing, Spot
from allocator.core.reservation.place import NoRoom, RoomPlan
from allocator.core.reservation.view import Seen, WaitingPod
from allocator.reservations.book import RoomBook
from allocator.reservations.cache_view import ReservationCache
from allocator.reservations.steering import RoomSteering
from allocator.reservations.waiting import WaitingPods
from allocator.runtime.cache.victims import all_candidates
from allocator.runtime.coreadapter import CoreAdapter, PodRequest
from apis.tolerations import admits, tolerations_of


class ClusterDoor:
    def __init__(
        self,
        cache: ReservationCache,
        core: CoreAdapter,
        book: RoomBook,
        steering: RoomSteering,
        waiting: WaitingPods,
    ) -> None:
        self.cache = cache
        self.core = core
        self.book = book
        self.steering = steering
        self.waiting_pods = waiting

    # -- placing -------------------------------------------------------------------------------------

    def admitting_nodes(self, seen: Seen) -> list[str]:
        res = seen.res
        assert res is not None
        spec = res.template.get("spec") or {}
        pinned = spec.get("nodeName") if isinstance(spec, dict) else None
        if pinned:
            return [pinned] if self.core.has_node(pinned) else []
        tolerations = tolerations_of(res.template)
        return [
            name
            for name, facts in self.cache.nodes.items()
            if self.core.has_node(name) and admits(facts.spec, tolerations)
        ]

    def place_one(self, name: str, req: PodRequest, names: Sequence[str]) -> Placing:
        got = self.core.place_room(req, names)
        if isinstance(got, NoRoom):
            return Placing(message=got.message, unresolvable=got.unresolvable)
        assert isinstance(got, RoomPlan)
        return Placing((Spot(name, got.node, got.allocation.devices, got.numa),))

    def place_gang(
        self, members: Sequence[str], reqs: Sequence[PodRequest], names: Sequence[str], topology: GangTopology
    ) -> Placing:
        settings = GangPlanSettings(topology_keys=topology.keys, scoring=self.core.scoring.device_scoring)
        got = self.core.plan_gang(
            reqs, settings, siblings=topology.siblings or {}, names=names, levels=topology.levels
        )
        if isinstance(got, NoPlan):
            return Placing(message=got.message, unresolvable=got.unresolvable)
        return Placing(_spots(members, reqs, got))

    def with_preemption(
        self, members: Sequence[str], reqs: Sequence[PodRequest], names: Sequence[str], topology: GangTopology
    ) -> Placing:
        cache = self.cache
        candidates = all_candidates(cache.pods, cache.ledger.holds, cache.budgets)
        settings = GangPlanSettings(topology_keys=topology.keys, scoring=self.core.scoring.device_scoring)
        got = self.core.plan_with_preemption(
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

    # -- the book's rooms ----------------------------------------------------------------------------

    def hold_room(self, spot: Spot, victims: tuple[str, ...], annotations: Mapping[str, str]) -> None:
        self.book.hold_placed(
            spot.name, spot.node, spot.devices, numa=spot.numa, victims=victims, extra=dict(annotations)
        )

    def victims_gone(self, name: str) -> None:
        self.book.set_victims(name, ())

    def release_room(self, name: str) -> str:
        entry = self.book.entries.get(name)
        node = entry.room.node if entry is not None and entry.room is not None else ""
        self.book.release(name)
        return node

    # -- freed room ------------------------------------------------------------------------------------

    def waiting(self, limit: int) -> Sequence[WaitingPod]:
        return self.waiting_pods.first(limit)

    def fits(self, pod: str, nodes: Collection[str]) -> str:
        entry = self.cache.pods.get(pod)
        raw = entry.raw if entry is not None else None
        if entry is None or raw is None or entry.node or entry.gang:
            return ""  # bound meanwhile, or a gang member (the gang controller's to release)
        names = [n for n in sorted(nodes) if self.core.has_node(n)]
        req = self.core.request(raw)
        if not names or req.invalid is not None:
            return ""
        verdicts = self.steering.filter(raw, req, names, tell=False)
        if verdicts is None:
            if not req.wants_devices:
                return ""  # nothing of the allocator's held it back
            verdicts = self.core.filter_nodes(req, names)
        return verdicts.passed[0] if verdicts.passed else ""


def _spots(members: Sequence[str], reqs: Sequence[PodRequest], plan: GangPlan) -> tuple[Spot, ...]:
    by_key = {req.key: name for name, req in zip(members, reqs, strict=True)}
    return tuple(Spot(by_key[p.key], p.node, p.allocation.devices) for p in plan.placements)
