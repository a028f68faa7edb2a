"""The placement lifecycle's door (allocator/core/placement/lifecycle.py `PlacementDoor`) over the
watch cache, the components' steering and the runtime's CoreAdapter: a pending pod's node chosen as
the extender would choose it (allocator/runtime/decide.py) among the nodes kube-scheduler would let
it onto at all (taints and cordons, nodeSelector and required node affinity, cpu, memory and the pod
count), its devices chosen and held in the hold ledger at once (a room's owner from its room, a
gang member its plan's), or why not, with the victims whose eviction would make room. The same
decision for a pod being admitted (`place_ahead`: allocator/placement/admit.py), its devices held
ahead until it shows up."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from allocator.core.actions import ObjectRef
from allocator.core.gang.plan import GangPlanSettings, NoPlan
from allocator.core.placement.lifecycle import NoRoom, Placed
from allocator.placement.cache_view import PlacementCache
from allocator.runtime.cache.records import Hold
from allocator.runtime.cache.victims import all_candidates
from allocator.runtime.coreadapter import CoreAdapter, PodRequest, Rejection
from allocator.runtime.decide import best_of, verdicts_for, why_not
from allocator.runtime.json_codec import dumps
from allocator.runtime.steering import Steering
from allocator.runtime.taints import admits, tolerations_of
from apis import keys
from apis.annotations import parse_device_allocated
from apis.errors import CodecError

JSON = dict[str, Any]
HOLDER = "placement"  # the hold ledger's holder of every placement
_MEMO = 256  # admitted node lists kept (by tolerations), until a Node changes


class ClusterDoor:
    def __init__(
        self, cache: PlacementCache, core: CoreAdapter, steering: Steering, *, preemption: bool = True
    ) -> None:
        self.cache = cache
        self.core = core
        self.steering = steering
        self.preemption = preemption
        self._admitted: dict[str, list[str]] = {}

    def nodes_changed(self) -> None:
        self._admitted.clear()

    # -- PlacementDoor ----------------------------------------------------------------------------

    def place(self, key: str, refused: frozenset[str]) -> Placed | NoRoom:
        entry = self.cache.pods.get(key)
        pod = entry.raw if entry is not None else None
        if pod is None or entry is None or entry.node:
            return NoRoom("the pod is gone or bound")
        ledger = self.cache.ledger
        return self.decide(pod, refused, lambda req, node: ledger.reserve(pod, req, node, holder=HOLDER))

    def place_ahead(self, pod: JSON, refused: frozenset[str], ttl: float) -> Placed | str:
        """Place a pod being admitted (`pod` as the admission request has it, its namespace set;
        no uid, maybe no name): its devices held ahead (`HoldLedger.reserve_ahead`) for `ttl`
        seconds or until it shows up carrying them. Else why not, for the metrics: the gated path
        then decides, explains and preempts ("no_room"), or waits for what the pod belongs to (a
        gang's plan, an RL job group's domain: "group"; a recorded allocation: "recorded")."""
        req = self.core.request(pod)
        if req.gang is not None or req.gang_error or req.rl_job_group:
            return "group"
        if req.designated is not None:
            return "recorded"
        ledger = self.cache.ledger
        got = self.decide(
            pod,
            refused,
            lambda req, node: ledger.reserve_ahead(pod, req, node, holder=HOLDER, ttl=ttl),
            req=req,
            explain=False,
        )
        return got if isinstance(got, Placed) else "no_room"

    def decide(
        self, pod: JSON, refused: frozenset[str], hold: Callable[[PodRequest, str], Hold | Rejection], *,
        req: PodRequest | None = None, explain: bool = True,
    ) -> Placed | NoRoom:  # fmt: skip
        """The pod's node (not one of `refused`) and devices, held by `hold`; or why not (with
        `explain`: kube-scheduler's way, and the victims whose eviction would make room). `req`:
        the pod's request when already parsed."""
        req = req if req is not None else self.core.request(pod)
        if req.invalid is not None:
            return NoRoom(req.invalid.message)
        admitting = self._admitting(pod)
        # The memo's own list when nothing is refused: the core recognises a list it saw last time.
        names = [n for n in admitting if n not in refused] if refused else admitting
        fit, short = self.core.kube_fits(req, names)
        decision = verdicts_for(self.core, self.steering, pod, req, fit)
        passed = decision.verdicts.passed
        if passed:
            node = best_of(self.core, self.steering, pod, req, passed)
            held = hold(req, node)
            if isinstance(held, Hold):
                return Placed(
                    node, {**held.extra, keys.DEVICE_ALLOCATED: held.annotation, keys.ALLOCATED_NODE: node}
                )
            short[node] = held.message
        if not explain:
            return NoRoom("")
        rejected = {**short, **decision.verdicts.failed, **decision.verdicts.unresolvable}
        why = why_not(self.core, req, rejected) if rejected else "no node admits the pod (taints, selectors)"
        victims = self._victims(req, names) if self.preemption and not decision.steered else ()
        return NoRoom(why, victims)

    def restore(self, key: str) -> bool:
        entry = self.cache.pods.get(key)
        pod = entry.raw if entry is not None else None
        if pod is None or entry is None:
            return False
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        node = annotations.get(keys.ALLOCATED_NODE, "")
        try:
            allocations = parse_device_allocated(annotations.get(keys.DEVICE_ALLOCATED, ""))
        except (CodecError, ValueError):
            return False
        if not node or not self.core.recorded_free(node, allocations):
            return False
        req = self.core.request(pod)
        got = self.cache.ledger.hold(key, entry.uid, node, allocations, req, HOLDER)
        return isinstance(got, Hold)

    def held(self, key: str) -> bool:
        return key in self.cache.ledger.holds

    def release(self, key: str) -> None:
        ledger = self.cache.ledger
        hold = ledger.holds.get(key)
        if hold is None:
            return
        if hold.holder == HOLDER:
            ledger.drop_hold(key, force=True)
        else:
            ledger.release(hold)  # a gang's plan holds it: only this placement of it is over

    # -- the nodes kube-scheduler would let the pod onto ------------------------------------------

    def _admitting(self, pod: JSON) -> list[str]:
        """The nodes the core knows whose taints the pod tolerates (cordons count as taints)."""
        tolerations = tolerations_of(pod)
        memo = dumps(tolerations, sort_keys=True)
        found = self._admitted.get(memo)
        if found is None:
            found = [
                name
                for name, facts in self.cache.nodes.items()
                if self.core.has_node(name) and admits(facts.spec, tolerations)
            ]
            if len(self._admitted) >= _MEMO:
                self._admitted.clear()
            self._admitted[memo] = found
        return found

    def _victims(self, req: PodRequest, names: Sequence[str]) -> tuple[tuple[ObjectRef, str], ...]:
        """The cheapest lower-priority pods whose eviction makes room for the pod (a gang of one to
        the core's gang preemption: device-aware, gangs whole, budgets weighed)."""
        ledger = self.cache.ledger
        candidates = all_candidates(self.cache.pods, ledger.holds, self.cache.budgets)
        if not any(c.priority < req.priority for c in candidates):
            return ()
        plan = self.core.plan_with_preemption(
            [req],
            candidates,
            GangPlanSettings(scoring=self.core.scoring.device_scoring),
            names=names,
            siblings={},
        )
        if isinstance(plan, NoPlan) or not plan.victims:
            return ()
        return tuple((ObjectRef(*v.key.split("/", 1), uid=v.uid), v.node) for v in plan.victims)
