"""The gang lifecycle's planner (allocator/core/gang/planner.py) over the allocator's watch cache,
member index, hold ledger and the runtime's CoreAdapter: the inputs of a plan read from the cache,
the core's decisions through the adapter, and the ledger's changes applied at once."""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import replace

from allocator.core.gang.actions import HoldPlan, ReleaseHolds
from allocator.core.gang.levels import Levels
from allocator.core.gang.min_resources import Shortage
from allocator.core.gang.plan import GangPlan, GangPlanSettings, NoPlan
from allocator.core.gang.preemption import PreemptionPlan
from allocator.core.gang.victims import Candidate
from allocator.core.gang.view import MemberPod
from allocator.gang.cache_view import GangCache
from allocator.gang.holds import PlanHolds
from allocator.gang.index import GangIndex
from allocator.gang.plan_inputs import admitting_nodes, member_requests, sibling_nodes
from allocator.runtime.cache import records
from allocator.runtime.cache.victims import all_candidates
from allocator.runtime.coreadapter import CoreAdapter, PodRequest
from allocator.runtime.topology import Topology
from apis.quantity import Quantity

log = logging.getLogger(__name__)


class ClusterPlanner:
    """Implements the core's `Planner`."""

    def __init__(
        self,
        cache: GangCache,
        core: CoreAdapter,
        holds: PlanHolds,
        index: GangIndex,
        settings: GangPlanSettings,
        topology: Topology | None = None,
    ) -> None:
        self.cache = cache
        self.core = core
        self.holds = holds
        self.index = index
        self._settings = settings
        self.topology = topology

    @property
    def settings(self) -> GangPlanSettings:
        """The plan settings with the topology profile's levels as the keys a plan prefers."""
        if self.topology is None:
            return self._settings
        return replace(self._settings, topology_keys=self.topology.profile.keys)

    # -- the inputs of a plan ------------------------------------------------------------------

    def requests(self, members: Sequence[MemberPod]) -> list[PodRequest]:
        return member_requests(self.cache, self.core, list(members))

    def admitting_nodes(self, members: Sequence[MemberPod]) -> list[str]:
        return admitting_nodes(self.cache, self.core, list(members))

    def sibling_nodes(self, gang: str, members: Sequence[MemberPod]) -> dict[str, int]:
        return sibling_nodes(self.core, self.index, gang, list(members))

    def running(self) -> list[Candidate]:
        return all_candidates(self.cache.pods, self.cache.ledger.holds, self.cache.budgets)

    def still_holding(self, victims: Iterable[Candidate]) -> list[Candidate]:
        pods = self.cache.pods
        out = []
        for victim in victims:
            entry = pods.get(victim.key)
            if entry is not None and entry.uid == victim.uid and entry.holds:
                out.append(victim)
        return out

    def pod_nodes(self, keys: Iterable[str]) -> dict[str, str]:
        pods = self.cache.pods
        return {k: entry.node for k in keys if (entry := pods.get(k)) is not None}

    # -- the core's decisions ------------------------------------------------------------------

    def plan_gang(
        self,
        requests: Sequence[PodRequest],
        *,
        siblings: Mapping[str, int],
        names: Iterable[str],
        levels: Levels | None = None,
    ) -> GangPlan | NoPlan:
        return self.core.plan_gang(requests, self.settings, siblings=siblings, names=names, levels=levels)

    def plan_with_preemption(
        self,
        requests: Sequence[PodRequest],
        candidates: Iterable[Candidate],
        *,
        names: Iterable[str],
        siblings: Mapping[str, int],
        levels: Levels | None = None,
    ) -> PreemptionPlan | NoPlan:
        settings = self.settings
        return self.core.plan_with_preemption(
            requests, candidates, settings, names=names, siblings=siblings, levels=levels
        )

    def min_resources_shortage(
        self, wanted: Mapping[str, Quantity], names: Iterable[str], removable: Collection[str]
    ) -> Shortage | None:
        return self.core.min_resources_shortage(wanted, names, removable)

    def whole_gpus_free(self, names: Iterable[str]) -> int:
        return self.core.whole_gpus_free(names)

    # -- the hold ledger -----------------------------------------------------------------------

    def hold(self, plan: HoldPlan) -> bool:
        """Hold every placement, or none: a refused hold drops the ones made before it."""
        made = []
        for hold in plan.holds:
            entry = self.cache.pods[hold.key]
            req = self.core.request(entry.raw or {})
            got = self.holds.reserve(hold.key, hold.uid, hold.node, hold.devices, req, plan.gang)
            if not isinstance(got, records.Hold):
                for key in made:
                    self.holds.release(key)
                log.warning("gang %s: holding %s failed: %s", plan.gang, hold.key, got)
                return False
            made.append(hold.key)
        return True

    def release(self, action: ReleaseHolds) -> None:
        for key in action.keys:
            self.holds.release(key, force=action.force)
