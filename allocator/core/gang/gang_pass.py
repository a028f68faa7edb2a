"""One gang controller pass over every gang, decided in the core: waiting gangs in queue order
(queueing.py), the starvation head handed to the first that waits for a placement, each gang's
lifecycle step (lifecycle.py), gangs without members forgotten, and the pass's gauges."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from allocator.core.actions import Observe
from allocator.core.gang.actions import HELD_DEVICES, WAITING_GANGS, WAITING_PODS, Action
from allocator.core.gang.gang_state import GangState
from allocator.core.gang.lifecycle import let_go, step
from allocator.core.gang.planner import LifecycleSettings, Planner
from allocator.core.gang.queueing import queue_order
from allocator.core.gang.view import Clocks, Gang


class GangPass:
    """One pass over every gang (the caller builds the views, steps through `order` and applies
    each step's actions, then `finish`'s)."""

    def __init__(
        self, gangs: Iterable[Gang], states: Mapping[str, GangState], now: Clocks, settings: LifecycleSettings
    ) -> None:
        self.settings = settings
        self.states = dict(states)
        self.order = sorted(gangs, key=lambda g: queue_order(g, self.states.get(g.key), now))
        self._head = True
        self._waiting = 0

    def step(self, gang: Gang, now: Clocks, planner: Planner) -> list[Action]:
        got = step(gang, self.states.get(gang.key), now, planner, settings=self.settings, head=self._head)
        self._head = self._head and not got.queued
        actions = list(got.actions)
        if not gang.members:  # written back to Pending if it had failed; forget it now
            self.states.pop(gang.key, None)
            let_go(got.state, planner, actions)
            return actions
        self.states[gang.key] = got.state
        planned = got.state.plan
        self._waiting += sum(1 for m in gang.active if not m.node and m.key not in planned)
        return actions

    def finish(self) -> list[Action]:
        """The pass's gauges: they replace the last pass's (a reason no gang waits for any more
        is not observed)."""
        reasons = Counter(s.wait_code or "Waiting" for s in self.states.values() if s.reason)
        held = sum(
            planned.devices
            for s in self.states.values()
            if s.preempting is not None
            for planned in s.plan.values()
        )
        out: list[Action] = [Observe(WAITING_PODS, self._waiting), Observe(HELD_DEVICES, held)]
        out.extend(Observe(WAITING_GANGS, count, reason) for reason, count in sorted(reasons.items()))
        return out
