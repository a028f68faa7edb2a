"""What one pass of the Reservation controller shows the lifecycle's step: the Reservations woken
(every one in a full pass), each gang of them whole, as the book and the watch cache hold them, with
what the controller learnt meanwhile: the PriorityClass values templates name (read from the API
once, before a Reservation is placed) and the condition note last written for each Reservation
(the step writes a condition only when it says something new)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from allocator.core.reservation.status import OwnerPod
from allocator.core.reservation.view import GangSeen, HeldRoom, PassView, Seen, Victim
from allocator.reservations import writes
from allocator.reservations.book import Entry, RoomBook
from allocator.reservations.cache_view import ReservationCache
from allocator.runtime.cache.records import PodEntry
from allocator.runtime.kube import KubeApi
from allocator.runtime.runner import Batch
from apis import reservation as rv
from apis.topology_profile import TopologyProfile


class PassInputs:
    def __init__(
        self,
        api: KubeApi,
        cache: ReservationCache,
        book: RoomBook,
        profile: Callable[[], TopologyProfile] | None = None,
    ) -> None:
        self.api = api
        self.cache = cache
        self.book = book
        self.profile = profile
        self.said: dict[str, tuple[str, str]] = {}  # name -> (uid, the condition note written)
        self.priorities: dict[str, int | None] = {}  # PriorityClass name -> value

    async def view(self, batch: Batch) -> PassView:
        """The pass's view; the rooms freed since the last pass are taken from the book."""
        entries = self.entries(batch)
        for entry in entries:
            await self._resolve_priority(entry)
        if batch.full:
            self.said = {k: v for k, v in self.said.items() if k in self.book.entries}
        return PassView(
            tuple(self._seen(e) for e in entries),
            self._gangs(entries),
            self.profile() if self.profile is not None else None,
            frozenset(self.book.take_freed()),
        )

    def remember(self, name: str, uid: str, said: str | None) -> None:
        """The condition note the Reservation now carries ("" forgets it, None leaves it)."""
        if said == "":
            self.said.pop(name, None)
        elif said is not None:
            self.said[name] = (uid, said)

    def entries(self, batch: Batch) -> list[Entry]:
        """The Reservations woken (every one in a full pass), with the whole gang of each."""
        book = self.book
        names = set(batch.select(book.entries))
        gangs = {e.res.gang for n in names if (e := book.entries.get(n)) and e.res and e.res.gang}
        if gangs and not batch.full:
            names |= {n for n, e in book.entries.items() if e.res is not None and e.res.gang in gangs}
        return [e for n in sorted(names) if (e := book.entries.get(n)) is not None]

    def _seen(self, e: Entry) -> Seen:
        said = self.said.get(e.name)
        room, node_exists, bound, owners = None, True, (), ()
        if e.room is not None:
            pods = self.cache.pods
            left = tuple(
                Victim(k, p.uid, p.node, p.deleting)
                for k in e.victims
                if (p := pods.get(k)) is not None and p.holds
            )
            room = HeldRoom(
                e.room.node, e.room.reserved, e.placed_here, e.victims, left, e.held_since, dict(e.extra)
            )
            node_exists = e.room.node in self.cache.nodes
            bound = tuple(sorted(self.book.consumers.get(e.name, ())))
            owners = tuple(_owner(k, p) for k in bound if (p := pods.get(k)) is not None)
        name = _class_name(e)
        return Seen(
            e.name,
            e.uid,
            e.res,
            e.error,
            _status(e.raw),
            e.req,
            self.priorities.get(name) if name else None,
            room,
            node_exists,
            bound,
            owners,
            said[1] if said is not None and said[0] == e.uid else "",
        )

    def _gangs(self, entries: list[Entry]) -> Mapping[str, GangSeen]:
        """Where each gang's members holding room are (members not looked at this pass count)."""
        wanted = {e.res.gang for e in entries if e.res is not None and e.res.gang}
        if not wanted:
            return {}
        holding: dict[str, Counter[str]] = {g: Counter() for g in wanted}
        for e in self.book.entries.values():
            if e.room is not None and e.res is not None and e.res.gang in wanted:
                holding[e.res.gang][e.room.node] += 1
        return {g: GangSeen(dict(nodes)) for g, nodes in holding.items()}

    async def _resolve_priority(self, e: Entry) -> None:
        """A template's priorityClassName read from the API once, when it is about to be placed."""
        name = _class_name(e)
        res = e.res
        if not name or name in self.priorities or e.room is not None or res is None:
            return
        if res.deleting or res.phase in (rv.SUCCEEDED, rv.FAILED):
            return
        self.priorities[name] = await writes.priority_value(self.api, name)


def _class_name(e: Entry) -> str:
    """The template's priorityClassName, when no spec.priority overrides it."""
    spec = (e.res.template.get("spec") if e.res is not None else None) or {}
    name = spec.get("priorityClassName") if spec.get("priority") is None else None
    return str(name or "")


def _owner(key: str, pod: PodEntry) -> OwnerPod:
    usage = pod.usage
    return (
        OwnerPod(key, pod.uid, usage.cpu_milli, usage.memory) if usage is not None else OwnerPod(key, pod.uid)
    )


def _status(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    status = raw.get("status")
    return status if isinstance(status, dict) else {}
