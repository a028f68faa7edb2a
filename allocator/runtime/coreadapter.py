"""The one place the allocator's runtime, extender and gang scheduling touch the core's cluster
state (docs/design/core.md).

Everything they ask of `ClusterState` goes through `CoreAdapter`, so a change in the core's
signatures is a change in this file only; nothing else names `allocator.core.cluster`
(tests/test_architecture.py). Pure core types and functions that take no cluster state (`PodRequest`,
`GangPlan`, `queue_key`, ...) are imported where they are used. The core is synchronous and pure;
the adapter adds no I/O either. The verbs read top to bottom, one name per step:

    filter:     handlers/filter.py     -> `CoreAdapter.filter_nodes` -> `ClusterState.verdicts`
    prioritize: handlers/prioritize.py -> `CoreAdapter.score_nodes`  -> `ClusterState.priority_column`
    bind:       handlers/bind.py -> `Binder.bind` -> `HoldLedger.reserve` -> `CoreAdapter.allocate`
                -> `ClusterState.allocate`
Gang members take a turn through the gang hooks first (extender/gang_hooks.py).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from itertools import compress
from typing import Any

import numpy as np

from allocator.core.claims.gang import place_gang
from allocator.core.claims.place import NoPlacement, place
from allocator.core.claims.published import NodeDevices, results_usage
from allocator.core.claims.solve import ClaimAnswer
from allocator.core.cluster import kube_checks
from allocator.core.cluster.columns import FilterVerdicts
from allocator.core.cluster.state import UNKNOWN_NODE, ClusterState
from allocator.core.defrag.inputs import DefragPlanSettings, PodFacts, Waiter
from allocator.core.defrag.plan import DefragPlan, plan_defrag
from allocator.core.devices.allocate import Allocation
from allocator.core.gang.levels import Levels, keep_to_level, plan_in_levels, preempt_in_levels
from allocator.core.gang.min_resources import Shortage, min_resources_shortage
from allocator.core.gang.plan import GangPlan, GangPlanSettings, NoPlan
from allocator.core.gang.preemption import PreemptionPlan, node_victims
from allocator.core.gang.siblings import sibling_priorities
from allocator.core.gang.victims import Candidate
from allocator.core.reasons import Rejection
from allocator.core.request.claims import ClaimsRequest
from allocator.core.request.pod_request import PodRequest
from allocator.core.request.usage import PodUsage, pod_usage
from allocator.core.reservation.consume import allocate_from_room, allocate_ignoring
from allocator.core.reservation.fit import short_of_rooms
from allocator.core.reservation.place import NoRoom, RoomPlan
from allocator.core.reservation.place import place as place_reservation
from allocator.core.reservation.room import Room
from allocator.core.scoring.scorer import NodeScorer, ScoringConfig
from allocator.runtime.request_memo import RequestMemo
from apis import dra
from apis.annotations import DeviceAllocations
from apis.dra_claims import DeviceResult
from apis.errors import CodecError
from apis.quantity import Quantity
from apis.resources import GPU as KOORD_GPU
from apis.resources import NVIDIA_GPU

__all__ = ["NOT_IN_CACHE", "CoreAdapter", "FilterVerdicts", "PodRequest", "PodUsage", "Rejection"]

log = logging.getLogger(__name__)

# The core's answer for a node it has never heard of (the watch cache is behind, or the node has
# no Node object): resolvable, since the node may show up in a moment.
NOT_IN_CACHE = Rejection(UNKNOWN_NODE.code, "node is not in the allocator's cache yet", unresolvable=False)
# The extender path's answer for a node in DRA mode: one node is in one mode (docs/dra.md).
DRA_MODE = Rejection(
    "topoalloc: node in DRA mode",
    "node hands its devices out through ResourceClaims (DRA mode), not device resources",
    unresolvable=True,
)


class CoreAdapter:
    def __init__(self, scoring: Mapping[str, Any] | None = None) -> None:
        self.cluster = ClusterState()
        self.scoring = ScoringConfig.from_dict(scoring or {})  # ValueError on a bad config
        self.scorer = NodeScorer(self.scoring)
        # Pods the allocator places (not those replayed from the watch) teach the scorer the
        # workload mix its fragmentation term plans for.
        self.cluster.add_observer(self.scorer.observe)
        self._requests = RequestMemo()
        # Nodes whose Device CR does not decode: their reason replaces "no free GPU".
        self.device_errors: dict[str, Rejection] = {}
        # Nodes whose Node says topoalloc.io/device-mode: dra. Their devices go to claims only.
        self.dra_nodes: set[str] = set()

    @staticmethod
    def check_scoring(scoring: Mapping[str, Any]) -> None:
        """Raise ValueError naming the bad field of a scoring config."""
        ScoringConfig.from_dict(scoring)

    # -- parsing (never raises: bad input becomes `invalid` / `error`) ------------------------------

    def request(self, pod: Mapping[str, Any]) -> PodRequest:
        """The pod's request, parsed once per pod version and once per shape (request_memo.py)."""
        return self._requests.request(pod)

    @staticmethod
    def usage(pod: Mapping[str, Any]) -> PodUsage:
        return pod_usage(pod)

    @staticmethod
    def usage_of(key: str, node: str, allocations: DeviceAllocations, req: PodRequest) -> PodUsage:
        """What `pod_usage` would read from a pod bound with these allocations, from the request
        already parsed at bind time (the pod's own requests, so the same numbers)."""
        return PodUsage(
            key, node, allocations, req.cpu_milli, req.memory, req.nonzero_cpu_milli, req.nonzero_memory,
            exclusive_cpus=req.exclusive_cpus, whole_cards=req.scalars.get(NVIDIA_GPU, 0) > 0,
            koord_shares=req.scalars.get(KOORD_GPU, 0) > 0,
        )  # fmt: skip

    # -- cluster state ------------------------------------------------------------------------------

    def has_node(self, name: str) -> bool:
        return name in self.cluster.nodes

    @property
    def pod_nodes(self) -> Mapping[str, str]:
        """pod key -> the node the core counts it on (bound, reserved or held)."""
        return self.cluster.pod_node

    def set_node(self, node: Mapping[str, Any]) -> str | None:
        """Install a Node's labels and allocatable; a problem string if it does not decode."""
        meta = node.get("metadata") or {}
        name = meta.get("name") or ""
        if (meta.get("labels") or {}).get(dra.MODE_LABEL) == dra.MODE_DRA:
            self.dra_nodes.add(name)
        else:
            self.dra_nodes.discard(name)
        try:
            self.cluster.upsert_node(node)
        except CodecError as exc:
            return f"Node is invalid: {exc}"
        return None

    def remove_node(self, name: str) -> None:
        self.dra_nodes.discard(name)
        self.cluster.remove_node(name)

    def set_device(self, device: Mapping[str, Any]) -> Rejection | None:
        """Install a Device CR. A malformed one leaves the node with no usable device, and the
        reason says why (every device pod is then rejected there with it)."""
        name = (device.get("metadata") or {}).get("name") or ""
        try:
            self.cluster.set_device(device)
        except CodecError as exc:
            self.cluster.remove_device(name)
            problem = Rejection("topoalloc: invalid Device", f"the node's Device CR is invalid: {exc}", True)
            self.device_errors[name] = problem
            return problem
        self.device_errors.pop(name, None)
        return None

    def has_inventory(self, name: str) -> bool:
        state = self.cluster.nodes.get(name)
        return state is not None and state.inventory is not None

    def remove_device(self, name: str) -> None:
        self.device_errors.pop(name, None)
        self.cluster.remove_device(name)

    def assign_usage(self, key: str, node: str, usage: PodUsage) -> None:
        self.cluster.assign(
            key, node, usage.allocations, usage.cpu_milli, usage.memory,
            nonzero_cpu_milli=usage.nonzero_cpu_milli, nonzero_memory=usage.nonzero_memory,
            exclusive_cpus=usage.exclusive_cpus, whole_cards=usage.whole_cards,
            koord_shares=usage.koord_shares,
        )  # fmt: skip

    def assign_reservation(
        self, key: str, node: str, allocations: DeviceAllocations, req: PodRequest
    ) -> None:
        self.cluster.assign(
            key, node, allocations, req.cpu_milli, req.memory,
            nonzero_cpu_milli=req.nonzero_cpu_milli, nonzero_memory=req.nonzero_memory, request=req,
        )  # fmt: skip

    def unassign(self, key: str) -> None:
        self.cluster.unassign(key)

    def rekey(self, old: str, new: str) -> bool:
        return self.cluster.rekey(old, new)

    def counted_as(self, key: str, node: str, usage: PodUsage) -> bool:
        return self.cluster.counted_as(key, node, usage)

    # -- decisions ----------------------------------------------------------------------------------

    def filter_nodes(self, req: PodRequest, names: Sequence[str]) -> FilterVerdicts:
        """The filter verb's answer: passed, failed and unresolvable messages and counts per
        reason code, built from the core's columns without a per-node Python loop. A node in DRA
        mode refuses a pod that asks for device resources."""
        dra_mode = self._dra_among(req, names)
        asked = [n for n in names if n not in dra_mode] if dra_mode else names
        verdicts = self.cluster.verdicts(req, asked, unknown=NOT_IN_CACHE)
        errors = self.device_errors
        if errors and any(n in verdicts.failed or n in verdicts.unresolvable for n in errors):
            # Rare (a Device CR that does not decode): the per-node path, which keeps the order.
            return FilterVerdicts.from_rejections(*self.filter_each(req, names))
        if dra_mode:
            verdicts.unresolvable.update(dict.fromkeys(dra_mode, DRA_MODE.message))
            verdicts.codes[DRA_MODE.code] += len(dra_mode)
        return verdicts

    def _dra_among(self, req: PodRequest, names: Iterable[str]) -> set[str]:
        """The DRA-mode nodes among `names`, when the pod asks for device resources."""
        if not self.dra_nodes or not req.wants_devices:
            return set()
        return {n for n in names if n in self.dra_nodes}

    def filter_each(self, req: PodRequest, names: Sequence[str]) -> tuple[list[str], dict[str, Rejection]]:
        """`filter_nodes` node by node: the names that can host the pod's devices, in the order
        given, and a reason for each other. A node whose Device CR does not decode says so rather
        than "no free GPU"."""
        dra_mode = self._dra_among(req, names)
        passed, failed = self.cluster.feasible(req, [n for n in names if n not in dra_mode])
        for name, rej in failed.items():
            if rej is UNKNOWN_NODE:
                failed[name] = NOT_IN_CACHE
        failed.update(dict.fromkeys(dra_mode, DRA_MODE))
        for name, problem in self.device_errors.items():
            if name in failed:
                failed[name] = problem
        return passed, failed

    def score_nodes(self, req: PodRequest, names: Sequence[str]) -> np.ndarray:
        """The prioritize verb's 0-10 as an int64 array aligned with `names` (0 for nodes the core
        does not know): the single best-ranked node alone at 10, ties broken by a stable node
        order, so kube-scheduler follows the core's ranking (docs/design/core.md, ranking)."""
        return self.cluster.priority_column(req, names, self.scorer)

    def allocate(self, req: PodRequest, node: str) -> DeviceAllocations | Rejection:
        """The bind-time choice, with the configured device scoring (Koordinator's Reserve)."""
        if node not in self.cluster.nodes:
            return NOT_IN_CACHE
        if self._dra_among(req, (node,)):
            return DRA_MODE
        result = self.cluster.allocate(req, node, self.scoring.device_scoring, scorer=self.scorer)
        if isinstance(result, Rejection):
            return result
        return result.devices

    def kube_fits(self, req: PodRequest, names: Sequence[str]) -> tuple[list[str], dict[str, str]]:
        """`names` split by kube-scheduler's own checks that the core models (nodeSelector and
        required node affinity, cpu, memory, the pod count): those that pass, and why each other
        keeps the pod off, in kube-scheduler's words. (The extender gets only nodes that passed
        them; placement asks them itself.) One cached column per request shape: O(changed nodes)
        of Python per call."""
        codes = self.cluster.kube_codes(req, names)
        passes = codes == kube_checks.PASS
        if passes.all():  # the usual answer: a copy, no per-name mask
            return list(names), {}
        passing = passes.tolist()
        fit = list(compress(names, passing))
        short = {
            name: kube_checks.MESSAGES[code] or UNKNOWN_NODE.message
            for name, code, ok in zip(names, codes.tolist(), passing, strict=True)
            if not ok
        }
        return fit, short

    def recorded_free(self, node: str, allocations: DeviceAllocations) -> bool:
        """Whether a recorded allocation's devices are all free on `node` now."""
        state = self.cluster.nodes.get(node)
        return state is not None and state.has_free(allocations)

    def node_rejection(self, req: PodRequest, node: str) -> Rejection | None:
        """The core's own reason `node` cannot host the pod, with its detail (what the node has
        left), for an Event; None when it can."""
        if self._dra_among(req, (node,)):
            return DRA_MODE
        return self.cluster.feasible(req, [node])[1].get(node)

    # -- preemption and gang planning ---------------------------------------------------------------

    def preemption_victims(
        self, req: PodRequest, nodes: Iterable[str], candidates: Sequence[Candidate]
    ) -> dict[str, list[Candidate]]:
        """Per node of `nodes` (in their order), the cheapest lower-priority victims among
        `candidates` that make room for the pod's devices there (the real device choice on a copy
        of the node without them); a node where no set does, none is needed or the core does not
        know is left out. A gang's candidates are weighed wherever they run (a gang goes whole)."""
        out: dict[str, list[Candidate]] = {}
        scoring = self.scoring.device_scoring
        for node in nodes:
            state = self.cluster.nodes.get(node)
            if state is None or self._dra_among(req, (node,)):
                continue
            here = [c for c in candidates if c.node == node or c.gang]
            got = node_victims(state, req, here, scoring=scoring)
            if got is not None and got.victims:
                out[node] = list(got.victims)
        return out

    def plan_gang(
        self,
        requests: Sequence[PodRequest],
        settings: GangPlanSettings,
        *,
        siblings: Mapping[str, int],
        names: Iterable[str],
        levels: Levels | None = None,
    ) -> GangPlan | NoPlan:
        """A placement for every member at once among `names` (core/gang/plan.py), inside one
        domain of the gang's topology levels (core/gang/levels.py); DRA-mode nodes take no member
        that asks for device resources."""
        names = self._mode_nodes(requests, names)
        return plan_in_levels(self.cluster, requests, settings, levels, siblings=siblings, names=names)

    def plan_with_preemption(
        self,
        requests: Sequence[PodRequest],
        candidates: Iterable[Candidate],
        settings: GangPlanSettings,
        *,
        names: Iterable[str],
        siblings: Mapping[str, int],
        levels: Levels | None = None,
    ) -> PreemptionPlan | NoPlan:
        """A placement for every member and the cheapest victims among `candidates` that make room
        for it (core/gang/preemption.py), keeping to the gang's topology levels (levels.py)."""
        names = self._mode_nodes(requests, names)
        return preempt_in_levels(
            self.cluster, requests, candidates, settings, levels, names=names, siblings=siblings
        )

    def _mode_nodes(self, requests: Sequence[PodRequest], names: Iterable[str]) -> list[str]:
        if self.dra_nodes and any(r.wants_devices for r in requests):
            return [n for n in names if n not in self.dra_nodes]
        return list(names)

    def plan_defrag(
        self, waiters: Sequence[Waiter], pods: Iterable[PodFacts], settings: DefragPlanSettings, now: float
    ) -> DefragPlan:
        """The moves that unblock the waiters (core/defrag/plan.py), on the nodes a pod asking for
        devices may use (not DRA-mode ones)."""
        names = [n for n in self.cluster.nodes if n not in self.dra_nodes]
        return plan_defrag(self.cluster, waiters, pods, settings, now=now, names=names)

    def keep_to_level(
        self, names: Sequence[str], siblings: Mapping[str, int], key: str, group: str
    ) -> tuple[list[str], dict[str, Rejection]]:
        """The nodes a job-group pod placed on its own may use under a required level (the
        siblings' domain of `key`), and why the others may not (core/gang/levels.py)."""
        return keep_to_level(self.cluster.nodes, names, siblings, key, group)

    def min_resources_shortage(
        self, wanted: Mapping[str, Quantity], names: Iterable[str], removable: Collection[str]
    ) -> Shortage | None:
        """The first resource of a PodGroup's minResources the nodes `names` cannot offer, even
        with the pods `removable` gone (core/gang/min_resources.py); None when they can."""
        return min_resources_shortage(self.cluster, wanted, names, removable)

    def whole_gpus_free(self, names: Iterable[str]) -> int:
        """Whole GPUs free on the nodes `names` (those the core does not know count none)."""
        nodes = self.cluster.nodes
        return sum(nodes[n].whole_gpus_free for n in names if n in nodes)

    def share_nvlink(self, node: str, minors: Iterable[int]) -> bool | None:
        """Whether the GPUs `minors` of `node` all sit in one NVLink domain (None: the core has no
        inventory of the node)."""
        state = self.cluster.nodes.get(node)
        if state is None or state.inventory is None:
            return None
        mask = sum(1 << m for m in set(minors))
        return any(mask & domain == mask for domain in state.inventory.nvlink_domains.values())

    def sibling_priorities(
        self,
        req: PodRequest,
        names: Sequence[str],
        siblings: Mapping[str, int],
        keys: Sequence[str],
        weight: float,
    ) -> dict[str, int]:
        """The prioritize answer for a pod with siblings: the scorer's scores blended with the
        affinity to nodes sharing `keys` labels with them (core/gang/siblings.py)."""
        return sibling_priorities(self.cluster, req, names, self.scorer, siblings, keys, weight)

    # -- reservations (core/reservation) ------------------------------------------------------------

    def room_allocate(
        self, req: PodRequest, room: Room, *, scored: bool = True, explain: list[str] | None = None
    ) -> DeviceAllocations | Rejection:
        """An owner's devices from `room` on its node (the room's own first); `scored=False` is
        the filter's check (no device scoring), True the bind's choice."""
        state = self.cluster.nodes.get(room.node)
        if state is None:
            return NOT_IN_CACHE
        if self._dra_among(req, (room.node,)):
            return DRA_MODE
        scoring = self.scoring.device_scoring if scored else None
        got = allocate_from_room(state, req, room, scoring=scoring, explain=explain)
        return got.devices if isinstance(got, Allocation) else got

    def ignoring_allocate(
        self, req: PodRequest, node: str, rooms: Iterable[str], *, scored: bool = True
    ) -> DeviceAllocations | Rejection:
        """A reservation-ignored pod's devices on `node`, the rooms `rooms` counted free."""
        state = self.cluster.nodes.get(node)
        if state is None:
            return NOT_IN_CACHE
        if self._dra_among(req, (node,)):
            return DRA_MODE
        got = allocate_ignoring(state, req, rooms, scoring=self.scoring.device_scoring if scored else None)
        return got.devices if isinstance(got, Allocation) else got

    def place_room(self, req: PodRequest, names: Iterable[str] | None = None) -> RoomPlan | NoRoom:
        """A Reservation's node and devices, chosen as a pod's are (core/reservation/place.py); a
        template of device resources never goes to a DRA-mode node (as a pod's would not)."""
        pool = list(self.cluster.nodes if names is None else names)
        refused = dict.fromkeys(self._dra_among(req, pool), DRA_MODE)
        return place_reservation(
            self.cluster, req, pool, scorer=self.scorer, scoring=self.scoring.device_scoring, refused=refused
        )

    def resources_short(self, req: PodRequest, names: Sequence[str]) -> dict[str, Rejection]:
        """The named nodes that lack cpu, memory or a pod slot for the pod once the rooms there are
        counted (kube-scheduler does not know what a room holds; core/reservation/fit.py)."""
        return short_of_rooms(self.cluster, req, names)

    # -- DRA claims ---------------------------------------------------------------------------------

    def claim_usage(
        self, node: str, pool: str, results: Iterable[DeviceResult]
    ) -> tuple[DeviceAllocations, list[str]]:
        """What a claim's results take on `node` (whoever allocated them), read against the node's
        Device; and the devices that could not be counted (core/claims/published.py)."""
        state = self.cluster.nodes.get(node)
        return results_usage(None if state is None else state.inventory, pool, results)

    def place_claims(
        self,
        creq: ClaimsRequest,
        names: Sequence[str],
        published: Mapping[str, NodeDevices],
        *,
        explain: bool = False,
    ) -> ClaimAnswer | NoPlacement:
        """The node and devices for a pod's claims among `names` (core/claims/place.py), with the
        configured device scoring and the extender's node scorer."""
        return place(
            self.cluster, creq, names, published, self.scorer, self.scoring.device_scoring, explain=explain
        )

    def place_claim_gang(
        self,
        members: Sequence[ClaimsRequest],
        names: Sequence[str],
        published: Mapping[str, NodeDevices],
        topology_keys: Sequence[str] = (),
        levels: Levels | None = None,
    ) -> list[ClaimAnswer] | NoPlacement:
        """Every member's claims at once, inside the gang's topology `levels` when it has some, or
        why not (core/claims/gang.py)."""
        settings = GangPlanSettings(topology_keys=tuple(topology_keys), scoring=self.scoring.device_scoring)
        return place_gang(self.cluster, members, names, published, self.scorer, settings, levels)
