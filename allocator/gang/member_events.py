"""A PodGroup gang's decisions told on its member pods too, once per change.

`kubectl describe pod` of a gated member otherwise shows nothing: the gang's Events are on the
PodGroup. Each member is told the gang's latest decision (waiting and why, preempting, holding
room, planned, timed out, scheduled) once; a decision of the same kind is not repeated, so a gang
waiting for hours writes one Event per member, not one per pass or per changed count (the
PodGroup's Events carry the details). A token bucket of its own keeps a 256-member gang from
spending the recorder's shared write budget at once: members not told yet are told on later passes.
"""

from __future__ import annotations

from collections.abc import Callable

from allocator.core.gang.gang_state import GangState
from allocator.core.gang.view import Gang
from allocator.runtime.events import EventSink, PodRef


class MemberEvents:
    def __init__(
        self, events: EventSink, clock: Callable[[], float], *, rate: float = 2.0, burst: int = 20
    ) -> None:
        self.events = events
        self.clock = clock
        self.rate = rate
        self.burst = float(burst)
        self._tokens = float(burst)
        self._at = clock()

    def _take(self) -> bool:
        now = self.clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        return False

    def tell(self, gang: Gang, state: GangState) -> int:
        """Tell the members that have not heard the latest decision; how many Events were queued."""
        d = state.decision
        if d is None:
            return 0
        told = 0
        for m in gang.active:
            if m.node and d.reason != "GangScheduled":
                continue  # a bound member is not waiting for anything
            key = (m.uid, d.kind)
            if state.members_told.get(m.key) == key:
                continue
            if not self._take():
                break  # the rest on a later pass
            state.members_told[m.key] = key
            self.events.record(
                PodRef(m.namespace, m.name, m.uid), d.type, d.reason, "Scheduling", d.member_note(gang.key)
            )
            told += 1
        return told
