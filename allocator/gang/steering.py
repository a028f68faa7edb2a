"""What gang scheduling changes in the extender's verbs.

* filter: a planned member passes its planned node only; a gang member without a plan passes no
  node ("held for its gang", resolvable, so kube-scheduler retries), which keeps the gang
  all-or-nothing even for members that reached kube-scheduler without the gate (webhook down,
  allocator restarted after releasing some of them, Kubernetes' own gangs, never gated where
  kube-scheduler's gang plugin runs). Neither does a member whose gang holds room that its victims
  (or, starving, the pods finishing there) still occupy: its devices are not free yet.
* prioritize: a planned member scores 10 on its node; any pod with siblings (its gang, its
  `rl-job-group`) gets the sibling affinity blended into the core's score, over the topology
  profile's levels.
* a pod of an `rl-job-group` placed on its own (not a gang member) whose group requires a
  topology level passes only nodes of its siblings' domain of that level (`job_group_bound`).
* bind (`bind_refusal`, asked by the cache and the binder): a member without a plan is refused,
  a planned member only goes to its planned node, with its planned devices (`HoldLedger.reserve`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from allocator.core.reasons import Rejection
from allocator.core.request.pod_request import PodRequest
from allocator.core.scoring.scorer import MAX_PRIORITY
from allocator.gang.holds import PlanHolds, plan_refusal, planned_elsewhere
from allocator.gang.index import GangIndex
from allocator.runtime.cache.records import Hold
from allocator.runtime.coreadapter import CoreAdapter, FilterVerdicts
from allocator.runtime.gang_settings import GangSettings
from allocator.runtime.topology import Topology

HELD = "topoalloc: held for gang"
TOPOLOGY = "InvalidTopology"


class GangSteering:
    def __init__(
        self,
        core: CoreAdapter,
        holds: PlanHolds,
        index: GangIndex,
        settings: GangSettings,
        topology: Topology,
        making_room: Callable[[str], bool] = lambda gang: False,
    ) -> None:
        self.core = core
        self.holds = holds
        self.index = index
        self.settings = settings
        self.topology = topology
        self.making_room = making_room  # gang key -> its held room is not free yet (the controller's)

    def manages(self, req: PodRequest) -> bool:
        """A gang member this allocator plans (its scheduler is one we serve)."""
        if req.gang is None and not req.gang_error:
            return False
        names = self.settings.scheduler_names
        member = self.index.pods.get(req.key)
        return not names or member is None or member.scheduler in names

    def guard(self, req: PodRequest) -> Rejection | None:
        """Why a pod without a planned reservation must not be placed: it is a gang member."""
        if not self.manages(req):
            return None
        if req.gang_error:
            return Rejection(HELD, f"invalid gang membership: {req.gang_error}", unresolvable=True)
        assert req.gang is not None
        return Rejection(HELD, f"held for gang {req.gang.key} until the whole gang is placed")

    def bind_refusal(self, req: PodRequest, node: str) -> Rejection | None:
        """Why the pod may not be bound to `node`: a plan holds it elsewhere (or for an older pod of
        its name), or it is a gang member without a plan. None: go ahead."""
        res = self.holds.planned(req.key)
        if res is not None:
            return self.room_refusal(res) or plan_refusal(res, req, node)
        return self.guard(req)

    def room_refusal(self, res: Hold) -> Rejection | None:
        """A held member whose gang is still making room: its planned devices are taken."""
        if not self.making_room(res.holder):
            return None
        return Rejection(HELD, f"held for gang {res.holder} until the room held for it is free")

    def filter(self, req: PodRequest, names: Sequence[str]) -> tuple[list[str], dict[str, Rejection]] | None:
        """The verdict for a gang member (None: not one, the normal filter decides)."""
        res = self.holds.planned(req.key)
        if res is not None:
            refusal = self.room_refusal(res) or plan_refusal(res, req, res.node)
            if refusal is not None:
                return [], dict.fromkeys(names, refusal)
            elsewhere = planned_elsewhere(res)
            passed = [n for n in names if n == res.node]
            return passed, {n: elsewhere for n in names if n != res.node}
        refusal = self.guard(req)
        if refusal is None:
            return None
        return [], dict.fromkeys(names, refusal)

    def adjusts(self, req: PodRequest) -> bool:
        """Whether `prioritize` would change the core's scores for this pod (a planned gang
        member, or siblings placed already): otherwise the caller keeps the scores as they are."""
        if self.holds.planned(req.key) is not None:
            return True
        return self.settings.sibling_weight > 0 and bool(self.sibling_nodes(req))

    def prioritize(self, req: PodRequest, names: Sequence[str], scores: Mapping[str, int]) -> dict[str, int]:
        res = self.holds.planned(req.key)
        if res is not None:
            return {n: MAX_PRIORITY if n == res.node else 0 for n in names}
        siblings = self.sibling_nodes(req)
        if not siblings or self.settings.sibling_weight <= 0:
            return dict(scores)
        keys, weight = self.topology.profile.keys, self.settings.sibling_weight
        return self.core.sibling_priorities(req, names, siblings, keys, weight)

    def job_group_filter(self, req: PodRequest, names: Sequence[str]) -> FilterVerdicts | None:
        """The filter's verdict for a job-group pod bound to a level (None: not bound): the core's
        own checks on the nodes of its domain, the level's reason on the others."""
        bound = self.job_group_bound(req, names)
        if bound is None:
            return None
        passed, refused = bound
        verdicts = self.core.filter_nodes(req, passed) if req.wants_devices else FilterVerdicts(passed)
        for name, why in refused.items():
            (verdicts.unresolvable if why.unresolvable else verdicts.failed)[name] = why.message
            verdicts.codes[why.code] += 1
        return verdicts

    def job_group_bound(
        self, req: PodRequest, names: Sequence[str]
    ) -> tuple[list[str], dict[str, Rejection]] | None:
        """For a job-group pod placed on its own whose group requires a level: the nodes of its
        siblings' domain (any node carrying the level's label before the first is placed) and why
        not the others. None: no such bound."""
        if not req.rl_job_group or req.gang is not None or req.gang_error:
            return None
        group = f"rl-job-group {req.namespace}/{req.rl_job_group}"
        keys_ = self.index.by_job.get((req.namespace, req.rl_job_group), ())
        members = sorted((self.index.pods[k] for k in keys_), key=lambda m: (m.created, m.name))
        levels, why = self.topology.levels_or_problem(members)
        if why:
            return [], dict.fromkeys(names, Rejection(TOPOLOGY, f"{group}: {why}", unresolvable=True))
        if levels is None or not levels.required:
            return None
        return self.core.keep_to_level(names, self.sibling_nodes(req), levels.top, group)

    def sibling_nodes(self, req: PodRequest) -> dict[str, int]:
        """node -> how many of the pod's siblings (gang, job group) hold or reserve room there."""
        job = (req.namespace, req.rl_job_group) if req.rl_job_group else None
        gang = req.gang.key if req.gang is not None else ""
        if not gang and job is None:
            return {}
        where = self.core.pod_nodes
        nodes = (where.get(k) for k in self.index.siblings(req.key, gang, job))
        return dict(Counter(n for n in nodes if n))
