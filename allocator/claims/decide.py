"""The claims lifecycle's planner (allocator/core/claims/lifecycle.py `ClaimsPlanner`): where a pod's
claims go (or a whole gang's), held in the hold ledger at once, or why not. Synchronous from choice
to hold, so no two decisions share a device. A gang keeps to the topology level (rack, block, ...)
its object or members ask for, in the allocator's topology profile, as every other gang does."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from allocator.claims.cache_view import ClaimsCache
from allocator.core.claims.place import NoPlacement
from allocator.core.claims.solve import ClaimAnswer
from allocator.core.claims.view import Member
from allocator.core.gang.levels import Levels
from allocator.core.request.claims import ClaimsRequest, translate
from allocator.core.request.usage import claim_usage_key
from allocator.runtime import json_codec
from allocator.runtime.coreadapter import CoreAdapter, Rejection
from allocator.runtime.taints import admits, tolerations_of
from allocator.runtime.topology import Topology
from apis import podgroup as pg
from apis.dra_claims import DeviceClass
from apis.errors import CodecError
from apis.gang_object import read_gang_object

JSON = dict[str, Any]
HOLDER = "claims"


@dataclass(frozen=True)
class _Wisher:
    """A member as the topology wish reads it."""

    key: str
    annotations: Mapping[str, str]


class Decider:
    def __init__(
        self,
        cache: ClaimsCache,
        core: CoreAdapter,
        topology_keys: Sequence[str] = (),
        topology: Topology | None = None,
    ) -> None:
        self.cache = cache
        self.core = core
        self.topology_keys = tuple(topology_keys)
        self.topology = topology
        self._candidates: dict[tuple[str, frozenset[str]], list[str]] = {}  # until a Node changes

    def nodes_changed(self) -> None:
        self._candidates.clear()

    def place(
        self, members: Sequence[Member], refused: frozenset[str] = frozenset()
    ) -> list[ClaimAnswer] | str:
        """Place every member's claims (one pod: `place_claims`; a gang: all at once) and hold
        their devices; or why not (an Event's note). `refused`: nodes left out."""
        classes = {k: v for k, v in self.cache.dra.classes.items() if isinstance(v, DeviceClass)}
        creqs = []
        for m in members:
            creq = translate(self.core.request(m.pod), [(c.key, c.spec) for c in m.todo], classes)
            if isinstance(creq, Rejection):
                return creq.message if len(members) == 1 else f"member {m.key}: {creq.message}"
            creqs.append(creq)
        published = self.cache.dra.published
        if len(members) == 1:
            (m,) = members
            names = [m.pinned] if m.pinned else self.candidate_nodes([m.pod], refused)
            got = self.core.place_claims(creqs[0], names, published)
            answers = [got] if isinstance(got, ClaimAnswer) else got
        else:
            levels = self.levels(members)
            if isinstance(levels, str):
                return levels
            names = self.candidate_nodes([m.pod for m in members], refused)
            answers = self.core.place_claim_gang(creqs, names, published, self.topology_keys, levels)
        if isinstance(answers, NoPlacement):
            return answers.summary() if answers.rejections or answers.message else "no node is in DRA mode"
        problem = self._hold(members, answers, creqs)
        return problem or answers

    def levels(self, members: Sequence[Member]) -> Levels | str | None:
        """The topology levels the members' gang keeps to (None: none), or why its wish is wrong."""
        if self.topology is None:
            return None
        try:
            ref = pg.gang_of(members[0].pod)
        except CodecError:
            return None
        if ref is None:
            return None
        stores = {
            pg.PODGROUP_SOURCE: self.cache.podgroups,
            pg.NATIVE_SOURCE: self.cache.native_podgroups,
            pg.WORKLOAD_SOURCE: self.cache.workloads,
        }
        _, raw, _ = read_gang_object(ref, stores)
        wishers = [_Wisher(m.key, (m.pod.get("metadata") or {}).get("annotations") or {}) for m in members]
        where = ref.object_key if raw is not None else ref.key
        levels, problem = self.topology.levels_or_problem(
            wishers, raw, where, native=ref.source == pg.NATIVE_SOURCE
        )
        return problem or levels

    def candidate_nodes(self, pods: Sequence[JSON], refused: frozenset[str] = frozenset()) -> list[str]:
        """The DRA-mode nodes every pod's tolerations admit (taints, cordons), `refused` left out."""
        tolerations = [tolerations_of(p) for p in pods]
        memo = (json_codec.dumps(tolerations, sort_keys=True), refused)
        found = self._candidates.get(memo)
        if found is not None:
            return found
        out = []
        for name in sorted(self.core.dra_nodes):
            facts = self.cache.nodes.get(name)
            if facts is None or name in refused or not all(admits(facts.spec, t) for t in tolerations):
                continue
            out.append(name)
        if len(self._candidates) >= 256:
            self._candidates.clear()
        self._candidates[memo] = out
        return out

    def _hold(
        self, members: Sequence[Member], answers: Sequence[ClaimAnswer], creqs: list[ClaimsRequest]
    ) -> str:
        held: list[str] = []
        for m, answer, creq in zip(members, answers, creqs, strict=True):
            # The pod's cpu and memory are its own, counted when it binds: a hold carries devices.
            req = replace(creq.pod, cpu_milli=0, memory=0, nonzero_cpu_milli=0, nonzero_memory=0)
            for claim in m.todo:
                key = claim_usage_key(claim.key)
                got = self.cache.ledger.hold_claim(
                    key, claim.uid, answer.node, answer.usage[claim.key], req, HOLDER
                )
                if isinstance(got, str):
                    self.drop(held)
                    return f"claim {claim.key}: {got}"
                held.append(key)
        return ""

    def drop(self, keys: Sequence[str]) -> None:
        for key in keys:
            self.cache.ledger.drop_hold(key, force=True)

    def drop_members(self, members: Sequence[Member]) -> None:
        self.drop([claim_usage_key(c.key) for m in members for c in m.todo])
