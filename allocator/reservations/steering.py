"""How the extender's verbs treat pods when Reservations exist: owners go to their room, pods that
must land in a reservation wait for one, reservation-ignored pods see every room's unallocated part
as free, and everyone else is kept off the cpu and memory rooms hold (kube-scheduler does not know
what a room holds; the devices are already counted as used by the core).

filter:  an owner with a usable room passes only the nodes of its rooms where the room (with the
         node, Aligned) can take it; without one it is placed as any pod, unless it carries a
         reservation-affinity (then no node passes: "Reservation(s) ...").
prioritize: the owner's first room node (in reservation order) gets the top score.
bind:    `place` is the hold ledger's placer: an owner's devices come from its room
         (core/reservation/consume.py), the binding writes `reservation-allocated`, and the room
         counts the bind as its owner at once (`RoomBook.take`).
Nothing here looks at every Reservation: owners are found through the owner index, rooms per node
through the book's node map, and a cluster without Reservations costs one dict lookup per verb.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from allocator.core.reservation.consume import in_room
from allocator.core.reservation.match import PodSide, pod_side
from allocator.reservations.book import Entry, RoomBook
from allocator.runtime.coreadapter import CoreAdapter, FilterVerdicts, PodRequest, Rejection
from allocator.runtime.events import EventSink
from allocator.runtime.ledger import Placed
from apis.extender import MAX_PRIORITY
from apis.reservation_pod import RESERVATION_AFFINITY, RESERVATION_ALLOCATED, ReservationAllocated

JSON = dict[str, Any]
ELSEWHERE = Rejection(
    "topoalloc: reserved elsewhere", "the pod's reservation is on another node", unresolvable=True
)
_SIDES = 1024  # pod sides kept (by uid and resourceVersion)


class RoomSteering:
    def __init__(self, book: RoomBook, core: CoreAdapter, events: EventSink) -> None:
        self.book = book
        self.core = core
        self.events = events
        self._sides: dict[tuple[Any, Any], PodSide] = {}

    def side(self, pod: JSON) -> PodSide:
        meta = pod.get("metadata") or {}
        key = (meta.get("uid"), meta.get("resourceVersion"))
        if not (key[0] and key[1]):
            return pod_side(pod)
        got = self._sides.get(key)
        if got is None:
            if len(self._sides) >= _SIDES:
                self._sides.clear()
            got = self._sides[key] = pod_side(pod)
        return got

    def _involved(self, side: PodSide) -> bool:
        """Whether Reservations can matter to this pod beyond the cpu and memory rooms hold."""
        return (
            side.required or side.ignored or bool(side.error) or bool(self.book.owners.candidates(side.meta))
        )

    # -- filter ------------------------------------------------------------------------------------------

    def filter(
        self, pod: JSON, req: PodRequest, names: Sequence[str], *, tell: bool = True
    ) -> FilterVerdicts | None:
        """The verdicts for a pod Reservations concern (None: the core's alone). `tell` False asks
        without an Event to the pod (the controller weighing whether freed room fits it)."""
        book = self.book
        if not book.entries and not _asks_for_one(pod):
            return None
        side = self.side(pod)
        if not self._involved(side):
            return self._ordinary(req, names)
        if side.ignored:
            return self._ignoring(req, names) if book.by_node else None
        rooms = book.matching(side)
        if rooms:
            passed, rejected = self._room_nodes(req, rooms, names)
            if passed:
                return FilterVerdicts.from_rejections(passed, rejected)
            if side.required:
                first = next(iter(rejected.values()), None)
                why = in_room(first) if first is not None else _nothing_matches(side, {})
                if tell:
                    self._tell(pod, why)
                return FilterVerdicts.from_rejections([], dict.fromkeys(names, why))
        elif side.required or side.error:
            why = _nothing_matches(side, book.reasons(side))
            if tell:
                self._tell(pod, why)
            return FilterVerdicts.from_rejections([], dict.fromkeys(names, why))
        return self._ordinary(req, names)

    def _room_nodes(
        self, req: PodRequest, rooms: list[Entry], names: Sequence[str]
    ) -> tuple[list[str], dict[str, Rejection]]:
        """Nodes (of `names`) where one of the rooms takes the pod, and a reason for the others."""
        wanted = set(names)
        fits: dict[str, Rejection | None] = {}
        for entry in rooms:
            room = entry.room
            assert room is not None
            if room.node not in wanted or fits.get(room.node, 0) is None:
                continue
            got = self.core.room_allocate(req, room, scored=False)
            if isinstance(got, Rejection):
                fits.setdefault(room.node, in_room(got))
            else:
                fits[room.node] = None
        passed = [n for n in names if n in fits and fits[n] is None]
        rejected = {n: fits.get(n) or ELSEWHERE for n in names if fits.get(n, ELSEWHERE) is not None}
        return passed, rejected

    def _ignoring(self, req: PodRequest, names: Sequence[str]) -> FilterVerdicts:
        """A reservation-ignored pod: nodes the core rejects pass when the rooms there, counted
        free, make room."""
        passed, failed = self.core.filter_each(req, names)
        rescued = set()
        for name in failed:
            if name in self.book.by_node:
                got = self.core.ignoring_allocate(req, name, self.book.rooms_on(name), scored=False)
                if not isinstance(got, Rejection):
                    rescued.add(name)
        if not rescued:
            return FilterVerdicts.from_rejections(passed, failed)
        keep = set(passed) | rescued
        return FilterVerdicts.from_rejections(
            [n for n in names if n in keep], {n: r for n, r in failed.items() if n not in rescued}
        )

    def _ordinary(self, req: PodRequest, names: Sequence[str]) -> FilterVerdicts | None:
        """Any other pod: its devices are the core's (rooms already count as used); only the cpu,
        memory and pod slots rooms hold are checked here (vectorised, core/reservation/fit.py)."""
        if not self.book.cpu_nodes or not (req.cpu_milli or req.memory):
            return None
        short = self.core.resources_short(req, names)
        if not short:
            return None
        return rejecting(self.core.filter_nodes(req, names), short)

    def _tell(self, pod: JSON, why: Rejection) -> None:
        self.events.warn(pod, "FailedReservation", "Scheduling", why.explained)

    # -- prioritize -----------------------------------------------------------------------------------

    def scores(
        self, pod: JSON, req: PodRequest, names: Sequence[str], scores: np.ndarray
    ) -> np.ndarray | None:
        book = self.book
        if not book.by_node:
            return None
        side = self.side(pod)
        if side.ignored or not self._involved(side):
            return None
        wanted = set(names)
        for entry in book.matching(side):
            room = entry.room
            assert room is not None
            if room.node in wanted and not isinstance(
                self.core.room_allocate(req, room, scored=False), Rejection
            ):
                out = np.minimum(np.asarray(scores, np.int64), MAX_PRIORITY - 1)
                out[[i for i, n in enumerate(names) if n == room.node]] = MAX_PRIORITY
                return out
        return None

    # -- bind (the hold ledger's placer) ----------------------------------------------------------------

    def place(self, pod: JSON, req: PodRequest, node: str, key: str) -> Placed | Rejection | None:
        """`key`: the hold's (the pod's, or a hold ahead's when placed at admission)."""
        book = self.book
        if not book.entries and not _asks_for_one(pod):
            return None
        side = self.side(pod)
        if side.ignored:
            if node not in book.by_node:
                return None
            plain = self.core.allocate(req, node)
            if not isinstance(plain, Rejection):
                return Placed(plain)
            got = self.core.ignoring_allocate(req, node, book.rooms_on(node))
            return got if isinstance(got, Rejection) else Placed(got)
        if not self._involved(side):
            return None
        first: Rejection | None = None
        for entry in book.matching(side, node):
            room = entry.room
            assert room is not None and entry.res is not None
            got = self.core.room_allocate(req, room)
            if isinstance(got, Rejection):
                first = first or got
                continue
            book.take(entry.name, key, req, got)
            allocated = ReservationAllocated(entry.name, entry.res.uid).to_json()
            return Placed(got, entry.name, {RESERVATION_ALLOCATED: allocated, **entry.extra})
        if side.required or side.error:
            return in_room(first) if first is not None else _nothing_matches(side, book.reasons(side))
        return None


def _asks_for_one(pod: JSON) -> bool:
    """The pod carries a reservation-affinity: it must land in a reservation, even with none yet."""
    return RESERVATION_AFFINITY in ((pod.get("metadata") or {}).get("annotations") or {})


def rejecting(verdicts: FilterVerdicts, more: dict[str, Rejection]) -> FilterVerdicts:
    """`verdicts` with the nodes of `more` rejected too (those already rejected keep their reason)."""
    out = FilterVerdicts(
        [n for n in verdicts.passed if n not in more],
        dict(verdicts.failed),
        dict(verdicts.unresolvable),
        Counter(verdicts.codes),
    )
    for name, why in more.items():
        if name in out.failed or name in out.unresolvable:
            continue
        (out.unresolvable if why.unresolvable else out.failed)[name] = why.message
        out.codes[why.code] += 1
    return out


def _nothing_matches(side: PodSide, reasons: dict[str, str]) -> Rejection:
    if side.error:
        return Rejection(
            "Reservation(s) invalid", f"Reservation(s) the pod's reservation annotations: {side.error}"
        )
    detail = "; ".join(f"{name}: {why}" for name, why in list(reasons.items())[:3])
    return Rejection(
        "Reservation(s) none matched",
        "Reservation(s) no reservation the pod may use is available",
        detail=detail or "no Reservation lists the pod among its owners",
    )
