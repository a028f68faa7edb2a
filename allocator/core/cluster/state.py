"""All nodes' states, with column caches of filter verdicts and scores, for filter and prioritize.

Every node has a slot in the cluster's `NodeTable`; verdicts and fine scores are numpy columns
per request signature (`allocator.core.columns`) that forget exactly the nodes changed since they
were last read, so after one placement the next pod of the same shape costs one `fits` and one
score plus a few vectorised operations over the node list, and a shape never seen before is
decided once per group of nodes in the same state. Nodes are ranked by the scorer's fine score
with ties broken by a stable per-node key (`rank`, `best`), and `priorities` gives the extender's
0..10 answer in that order (`allocator.core.ranking`). Pods placed with
`assign(..., request=req)` are reported to observers (the scorer's learned workload mix).

Also the kube-scheduler checks the simulator, the gang planner and placement need (the extender
gets those from kube-scheduler itself), from kube_checks.py: `resources_fit` (cpu, memory, pods)
and `affinity_matches` (nodeSelector, required node affinity) per node, `kube_codes` for a node
list as a cached column.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from itertools import compress
from typing import Any

import numpy as np

from allocator.core.cluster.columns import (
    PASS,
    FilterVerdicts,
    ScoreColumn,
    VerdictColumn,
    rejection_map,
    verdicts_of,
)
from allocator.core.cluster.kube_checks import KubeColumn, affinity_matches, kube_shape, resources_fit
from allocator.core.cluster.ranking import best, extender_priorities, ranked, tie_key
from allocator.core.devices.allocate import Allocation, allocate
from allocator.core.node.inventory import NodeInventory, build_inventory, node_partition_choice
from allocator.core.node.state import NodeState, node_facts
from allocator.core.node.table import NodeTable
from allocator.core.reasons import Rejection
from allocator.core.request.pod_request import PodRequest
from allocator.core.request.usage import PodUsage, pod_usage
from allocator.core.scoring.device import DeviceScoring
from allocator.core.scoring.scorer import MAX_PRIORITY, NodeScorer, to_priorities, to_priority
from apis import resources as rn
from apis.annotations import DeviceAllocations
from apis.device import Device

UNKNOWN_NODE = Rejection("topoalloc: unknown node", "node is not known to the allocator", unresolvable=True)
_SIGNATURES: dict[tuple[Any, ...], int] = {}
_signature_ids = itertools.count(1)


def signature_id(req: PodRequest) -> int:
    """A small int for the request's signature: dict lookups hash it instantly. Ids are never
    reused, so forgetting old signatures cannot make a cached verdict answer another shape."""
    sid = _SIGNATURES.get(req.signature)
    if sid is None:
        if len(_SIGNATURES) > 100_000:
            _SIGNATURES.clear()
        sid = _SIGNATURES[req.signature] = next(_signature_ids)
    return sid


_SCORE_KEYS: dict[tuple[int, int], int] = {}


def _score_key(sid: int, scorer_key: int) -> int:
    key = _SCORE_KEYS.get((sid, scorer_key))
    if key is None:
        if len(_SCORE_KEYS) > 100_000:
            _SCORE_KEYS.clear()
        key = _SCORE_KEYS[(sid, scorer_key)] = next(_signature_ids)  # shares the never-reused ids
    return key


_COLUMNS = 256  # per kind: the least recently used request shape's column goes past this


class _TieKeys(dict[str, int]):
    """Node name -> stable tie key, computed on first use (`ties[name]` stays a C-level lookup)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.seed = seed

    def __missing__(self, name: str) -> int:
        key = self[name] = tie_key(name, self.seed)
        return key


class ClusterState:
    """`tie_seed` fixes the order among nodes of equal score (a keyed hash of the name)."""

    def __init__(self, tie_seed: int = 0) -> None:
        self.nodes: dict[str, NodeState] = {}
        self.pod_node: dict[str, str] = {}
        self.tie_seed = tie_seed
        self._ties = _TieKeys(tie_seed)
        self.observers: list[Callable[[PodRequest], None]] = []
        self.table = NodeTable(self._ties.__getitem__)
        self._verdicts: dict[int, VerdictColumn] = {}  # signature id -> column
        self._scores: dict[int, ScoreColumn] = {}  # score key (signature, scorer state) -> column
        self._kube: dict[tuple[Any, ...], KubeColumn] = {}  # kube_shape -> column

    def add_observer(self, observer: Callable[[PodRequest], None]) -> None:
        """Call `observer(req)` for every pod assigned with its request (e.g. `scorer.observe`)."""
        self.observers.append(observer)

    def tie_key(self, name: str) -> int:
        return self._ties[name]

    # -- watch events ------------------------------------------------------------------------------
    def upsert_node(self, node: Mapping[str, Any]) -> NodeState:
        """A Node add/update: labels and allocatable (raises CodecError on bad quantities)."""
        name, labels, allocatable = node_facts(node)
        state = self.nodes.get(name)
        if state is None:
            state = self.nodes[name] = NodeState(name, None, labels, allocatable)
            self.table.attach(state)
            return state
        relabelled = labels != state.labels
        state.set_labels(labels, allocatable)
        inv = state.inventory
        if relabelled and inv is not None and inv.partition_source != "device":
            # The built-in partition table and its policy come from the Node's labels.
            state.set_inventory(_rebuild(inv, labels))
        return state

    def set_device(self, device: Device | Mapping[str, Any]) -> NodeState:
        """A Device add/update (name = node name); raises CodecError when it does not decode."""
        if not isinstance(device, Device):
            device = Device.from_dict(device)
        state = self.nodes.get(device.name)
        labels = state.labels if state is not None and state.labels else None
        inv = build_inventory(device, labels)
        if state is None:
            state = self.nodes[device.name] = NodeState(device.name, inv, dict(device.labels))
            self.table.attach(state)
        else:
            state.set_inventory(inv)
        return state

    def remove_device(self, name: str) -> None:
        """A Device delete: the node stays, every device unhealthy until the CR returns (2.2)."""
        state = self.nodes.get(name)
        if state is not None:
            state.devices_gone()

    def remove_node(self, name: str) -> None:
        state = self.nodes.pop(name, None)
        if state is not None:
            self.table.detach(name)
            for key in list(state.pods):
                self.pod_node.pop(key, None)

    def assign(
        self,
        pod_key: str,
        node: str,
        allocations: DeviceAllocations | None,
        cpu_milli: int = 0,
        memory: int = 0,
        *,
        nonzero_cpu_milli: int | None = None,
        nonzero_memory: int | None = None,
        request: PodRequest | None = None,
        exclusive_cpus: int | None = None,
        whole_cards: bool | None = None,
        koord_shares: bool | None = None,
    ) -> None:
        """Count a pod on a node (moving it if it was counted elsewhere). With `request` (a pod
        being placed, not one replayed from the watch), observers are told about it."""
        old = self.pod_node.get(pod_key)
        if old is not None and old != node:
            self.unassign(pod_key)
        state = self.nodes.get(node)
        if state is None:
            state = self.nodes[node] = NodeState(node)
            self.table.attach(state)
        if request is not None:  # what kubelet's Topology Manager will count of it (kubelet_view.py)
            exclusive_cpus = request.exclusive_cpus if exclusive_cpus is None else exclusive_cpus
            whole_cards = request.scalars.get(rn.NVIDIA_GPU, 0) > 0 if whole_cards is None else whole_cards
            koord_shares = request.scalars.get(rn.GPU, 0) > 0 if koord_shares is None else koord_shares
        state.add_pod(
            pod_key,
            allocations,
            cpu_milli,
            memory,
            nonzero_cpu_milli=nonzero_cpu_milli,
            nonzero_memory=nonzero_memory,
            exclusive_cpus=exclusive_cpus or 0,
            whole_cards=bool(whole_cards),
            koord_shares=bool(koord_shares),
        )
        self.pod_node[pod_key] = node
        if request is not None:
            for observe in self.observers:
                observe(request)

    def assign_usage(self, usage: PodUsage) -> None:
        self.assign(
            usage.key,
            usage.node,
            usage.allocations,
            usage.cpu_milli,
            usage.memory,
            nonzero_cpu_milli=usage.nonzero_cpu_milli,
            nonzero_memory=usage.nonzero_memory,
            exclusive_cpus=usage.exclusive_cpus,
            whole_cards=usage.whole_cards,
            koord_shares=usage.koord_shares,
        )

    def assign_pod(self, pod: Mapping[str, Any]) -> PodUsage:
        """A bound pod from the watch: counted on its node (terminated pods are released)."""
        usage = pod_usage(pod)
        if usage.node:
            self.assign_usage(usage)
        return usage

    def rekey(self, old: str, new: str) -> bool:
        """Count the pod counted as `old` as `new` (a hold made at admission that became its pod's),
        nothing else changed, so no cached verdict or score is refreshed. False: nothing done."""
        node = self.pod_node.get(old)
        state = self.nodes.get(node) if node is not None else None
        if state is None or new in self.pod_node or not state.rekey(old, new):
            return False
        del self.pod_node[old]
        self.pod_node[new] = state.name
        return True

    def counted_as(self, key: str, node: str, usage: PodUsage) -> bool:
        """Whether `key` is counted on `node` exactly as `usage` would count it (a hold whose pod
        is now bound as held): then there is nothing to re-count."""
        state = self.nodes.get(node) if self.pod_node.get(key) == node else None
        entry = state.pods.get(key) if state is not None else None
        return entry is not None and (
            entry.allocations, entry.cpu_milli, entry.memory, entry.nonzero_cpu_milli, entry.nonzero_memory,
            entry.exclusive_cpus, entry.whole_cards, entry.koord_shares,
        ) == (
            usage.allocations, usage.cpu_milli, usage.memory, usage.nonzero_cpu_milli, usage.nonzero_memory,
            usage.exclusive_cpus, usage.whole_cards, usage.koord_shares,
        )  # fmt: skip

    def unassign(self, pod_key: str) -> bool:
        node = self.pod_node.pop(pod_key, None)
        state = self.nodes.get(node) if node is not None else None
        return state.remove_pod(pod_key) if state is not None else False

    # -- questions ---------------------------------------------------------------------------------
    def feasible(
        self, req: PodRequest, names: Iterable[str] | None = None, *, unknown: Rejection = UNKNOWN_NODE
    ) -> tuple[list[str], dict[str, Rejection]]:
        """Nodes where the pod's devices fit (in the order named), and a rejection for every other
        named node (`unknown` for names the cluster does not have)."""
        names = _as_list(self.nodes if names is None else names)
        slots, codes = self._verdict_codes(req, names)
        rejected = codes != PASS
        passed = list(compress(names, (~rejected).tolist()))
        self.table.remember(passed, slots[~rejected])  # what prioritize will be asked about
        if not rejected.any():
            return passed, {}
        objects = self._verdicts[signature_id(req)].arrays(unknown)[0]
        return passed, rejection_map(names, codes, rejected, objects)

    def verdicts(
        self, req: PodRequest, names: Sequence[str], *, unknown: Rejection = UNKNOWN_NODE
    ) -> FilterVerdicts:
        """`feasible` as the extender replies it: messages split by whether preemption could cure
        them and counts per reason code, built without a per-node Python loop."""
        names = _as_list(names)
        slots, codes = self._verdict_codes(req, names)
        verdicts = verdicts_of(names, codes, self._verdicts[signature_id(req)], unknown)
        self.table.remember(verdicts.passed, slots[codes == PASS])
        return verdicts

    def _verdict_codes(self, req: PodRequest, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
        slots = self.table.slots_of(names)
        return slots, _lru(self._verdicts, signature_id(req), lambda: VerdictColumn(req)).codes_for(
            self.table, slots
        )

    def _fine(
        self, req: PodRequest, scorer: NodeScorer, names: list[str]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(mask of the known names, their slots, the float64 fine score of each)."""
        scorer.sync(self.table)
        table = self.table
        slots = table.slots_of(names)
        known = slots >= 0
        if not known.all():
            slots = slots[known]
        column = _lru(self._scores, _score_key(signature_id(req), scorer.key), ScoreColumn)
        column.refresh(table)
        todo = slots[~column.known[slots]]
        if len(todo):
            todo = np.unique(todo)
            column.values[todo] = scorer.fine_grouped(table, todo, scorer.prepare(req))
            column.known[todo] = True
        return known, slots, column.values[slots]

    def fine_scores(self, req: PodRequest, names: Iterable[str], scorer: NodeScorer) -> dict[str, float]:
        """The scorer's fine score (0..100) per named known node, cached per node version."""
        names = _as_list(names)
        known, _slots, fine = self._fine(req, scorer, names)
        return dict(zip(compress(names, known.tolist()), fine.tolist(), strict=True))

    def score(self, req: PodRequest, names: Iterable[str], scorer: NodeScorer) -> dict[str, int]:
        """0..10 per named node, each node on its own (unknown nodes score 0). For the extender's
        answer use `priorities`, which keeps the ranking."""
        names = _as_list(names)
        known, _slots, fine = self._fine(req, scorer, names)
        if not np.isfinite(fine).all():  # keep the scalar path's behaviour (an error) exactly
            fine_map = dict(zip(compress(names, known.tolist()), fine.tolist(), strict=True))
            return {name: to_priority(fine_map[name]) if name in fine_map else 0 for name in names}
        out = np.zeros(len(names), np.int64)
        out[known] = to_priorities(fine)
        return dict(zip(names, out.tolist(), strict=True))

    def rank(self, req: PodRequest, names: Iterable[str], scorer: NodeScorer) -> list[str]:
        """Known named nodes, best first: fine score, then the stable tie key."""
        names = _as_list(names)
        known, slots, fine = self._fine(req, scorer, names)
        if not np.isfinite(fine).all() or len(np.unique(slots)) != len(slots):
            # a name twice, or a score that is no number: `ranked` over the mapping, as it was
            fine_map = dict(zip(compress(names, known.tolist()), fine.tolist(), strict=True))
            return ranked(fine_map, self._ties.__getitem__)
        order = np.lexsort((self.table.ties[slots], -fine))  # stable: equal keys keep their order
        table_names = self.table.names
        return [table_names[i] for i in slots[order].tolist()]

    def best(self, req: PodRequest, names: Iterable[str], scorer: NodeScorer) -> str | None:
        """The first node of `rank` (None when no named node is known)."""
        names = _as_list(names)
        known, slots, fine = self._fine(req, scorer, names)
        if not len(fine):
            return None
        if not np.isfinite(fine).all():
            fine_map = dict(zip(compress(names, known.tolist()), fine.tolist(), strict=True))
            return best(fine_map, self._ties.__getitem__)
        return self.table.names[int(slots[_best_index(fine, self.table.ties[slots])])]

    def priorities(self, req: PodRequest, names: Iterable[str], scorer: NodeScorer) -> dict[str, int]:
        """The extender's prioritize answer: 0..10 per named node, 10 for the best-ranked node
        alone, at most 9 for the others, 0 for unknown nodes."""
        names = _as_list(names)
        return dict(zip(names, self.priority_column(req, names, scorer).tolist(), strict=True))

    def priority_column(self, req: PodRequest, names: Sequence[str], scorer: NodeScorer) -> np.ndarray:
        """`priorities` as an int64 array aligned with `names`, for replies written without a
        per-node dict."""
        names = _as_list(names)
        known, slots, fine = self._fine(req, scorer, names)
        if not np.isfinite(fine).all():
            fine_map = dict(zip(compress(names, known.tolist()), fine.tolist(), strict=True))
            out_map = extender_priorities(fine_map, self._ties.__getitem__)
            return np.array([out_map.get(name, 0) for name in names], np.int64)
        prios = np.minimum(to_priorities(fine), MAX_PRIORITY - 1)
        if len(fine):
            top = slots[_best_index(fine, self.table.ties[slots])]
            prios[slots == top] = MAX_PRIORITY  # every mention of the best node
        out = np.zeros(len(names), np.int64)
        out[known] = prios
        return out

    def forget_cached(self) -> None:
        """Drop every cached verdict and score (benchmarks measure a never-seen shape this way)."""
        self._verdicts.clear()
        self._scores.clear()
        self._kube.clear()

    def allocate(
        self,
        req: PodRequest,
        node: str,
        scoring: DeviceScoring | None = None,
        *,
        scorer: NodeScorer | None = None,
        **kwargs: Any,
    ) -> Allocation | Rejection:
        """The bind-time device choice. With `scorer`, GPUs its score assumed for a shared pod
        (the fragmentation term's pick) are taken when still free (`allocate(prefer=)`)."""
        state = self.nodes.get(node)
        if state is None:
            return UNKNOWN_NODE
        if scorer is not None and "prefer" not in kwargs:
            kwargs["prefer"] = scorer.preferred_gpus(state, req)
        return allocate(state, req, scoring=scoring, **kwargs)

    def resources_fit(self, node: str, req: PodRequest) -> Rejection | None:
        state = self.nodes.get(node)
        return UNKNOWN_NODE if state is None else resources_fit(state, req)

    def affinity_matches(self, node: str, req: PodRequest) -> bool:
        state = self.nodes.get(node)
        return state is not None and affinity_matches(state, req)

    def kube_codes(self, req: PodRequest, names: Sequence[str]) -> np.ndarray:
        """kube-scheduler's modelled checks (kube_checks.py) for each named node, as codes into
        `kube_checks.MESSAGES` aligned with `names` (UNKNOWN for names not in the cluster)."""
        slots = self.table.slots_of(_as_list(names))
        shape = kube_shape(req)
        column = self._kube.pop(shape, None) or KubeColumn(req)
        if len(self._kube) >= _COLUMNS:
            del self._kube[next(iter(self._kube))]
        self._kube[shape] = column
        return column.codes_for(self.table, slots)


def _as_list(names: Iterable[str]) -> list[str]:
    return names if isinstance(names, list) else list(names)


def _lru(cache: dict[int, Any], key: int, make: Callable[[], Any]) -> Any:
    """The entry for `key`, made when missing, now the most recently used of a bounded dict."""
    entry = cache.pop(key, None)
    if entry is None:
        entry = make()
        if len(cache) >= _COLUMNS:
            del cache[next(iter(cache))]
    cache[key] = entry
    return entry


def _best_index(fine: np.ndarray, ties: np.ndarray) -> int:
    """Index of the highest score, ties to the lowest tie key (then the first): `ranking.best`."""
    top = fine.max()
    leaders = np.flatnonzero(fine == top)
    if len(leaders) == 1:
        return int(leaders[0])
    return int(leaders[np.argmin(ties[leaders])])


def _rebuild(inv: NodeInventory, labels: Mapping[str, str]) -> NodeInventory:
    """The inventory with the partition choice re-derived from new Node labels (8.3 step 2)."""
    partitions, source, honor = node_partition_choice(labels)
    return replace(inv, partitions=partitions, partition_source=source, partition_honor=honor)
