"""What the Reservation lifecycle's step asks of the cluster.

`Door` is the step's one door to the cluster: the nodes a template is let onto, the core's
placements (one Reservation, a gang of them at once inside one domain of their topology level,
either with the cheapest lower-priority pods to evict), the hold ledger's changes (applied at once,
because placements made later in the same pass must see them), and for freed room the pods
kube-scheduler holds back and whether one fits a node now. The allocator implements it over its
book, watch cache and CoreAdapter (allocator/reservations/placing.py); tests with a fake.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from allocator.core.gang.levels import Levels, levels_of
from allocator.core.gang.victims import Candidate
from allocator.core.request.pod_request import PodRequest
from allocator.core.reservation.view import Seen, WaitingPod
from apis.annotations import DeviceAllocations
from apis.errors import CodecError
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


@dataclass(frozen=True)
class GangTopology:
    """What a gang of Reservations keeps to: the profile's levels as the plan's topology keys (one
    domain preferred), the level its members ask for, and where members already holding room are."""

    keys: tuple[str, ...] = ()
    levels: Levels | None = None
    siblings: Mapping[str, int] | None = None  # node -> members holding room there


def gang_levels(members: Sequence[Seen], profile: TopologyProfile) -> Levels | None:
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


class Door(Protocol):
    # -- placing ---------------------------------------------------------------------------------

    def admitting_nodes(self, seen: Seen) -> list[str]:
        """The nodes the template is let onto: its nodeName alone when set, else those whose taints
        and cordon its tolerations accept."""
        ...

    def place_one(self, name: str, req: PodRequest, names: Sequence[str]) -> Placing: ...

    def place_gang(
        self, members: Sequence[str], reqs: Sequence[PodRequest], names: Sequence[str], topology: GangTopology
    ) -> Placing:
        """Every member at once (fewest nodes, best topology, one domain; one domain of a required
        level or none placed)."""
        ...

    def with_preemption(
        self, members: Sequence[str], reqs: Sequence[PodRequest], names: Sequence[str], topology: GangTopology
    ) -> Placing:
        """A placement for every member and the cheapest lower-priority pods (a gang of pods only
        whole, PodDisruptionBudgets last) whose eviction makes room for it."""
        ...

    # -- the hold ledger, at once ------------------------------------------------------------------

    def hold_room(self, spot: Spot, victims: tuple[str, ...], annotations: Mapping[str, str]) -> None:
        """Hold the room placed here (its owners' steering waits for `victims` to be gone)."""
        ...

    def victims_gone(self, name: str) -> None:
        """The room's victims are gone: it no longer waits for them."""
        ...

    def release_room(self, name: str) -> str:
        """Give the room back; the node it was on ("" when none was held)."""
        ...

    # -- freed room ---------------------------------------------------------------------------------

    def waiting(self, limit: int) -> Sequence[WaitingPod]:
        """The first `limit` pods kube-scheduler holds as unschedulable, in its queue order."""
        ...

    def fits(self, pod: str, nodes: Collection[str]) -> str:
        """A node of `nodes` the extender's filter would pass `pod` on now ("" for none)."""
        ...
