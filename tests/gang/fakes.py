"""An in-memory `GangCache` (allocator/gang/cache_view.py) for unit tests of gang scheduling:
pending pods and Nodes the test puts in, and the runtime's hold ledger over them (gang plans only
hold devices they chose already: the ledger's own core choice is never asked for)."""

from __future__ import annotations

from typing import Any

from allocator.runtime.cache.budgets import DisruptionBudgets
from allocator.runtime.cache.dra import ClaimEntry
from allocator.runtime.cache.records import NodeFacts, PodEntry, node_facts, pod_key
from allocator.runtime.coreadapter import PodRequest, Rejection
from allocator.runtime.ledger import HoldLedger
from apis.annotations import DeviceAllocations


def _no_choice(req: PodRequest, node: str) -> DeviceAllocations | Rejection:
    raise AssertionError("gang scheduling holds what its plan chose; it never asks the ledger to choose")


class FakeClaims:
    def __init__(self) -> None:
        self.claims: dict[str, ClaimEntry] = {}


class FakeGangCache:
    def __init__(self) -> None:
        self.pods: dict[str, PodEntry] = {}
        self.nodes: dict[str, NodeFacts] = {}
        self.podgroups: dict[str, dict[str, Any]] = {}
        self.native_podgroups: dict[str, dict[str, Any]] = {}
        self.workloads: dict[str, dict[str, Any]] = {}
        self.ledger = HoldLedger(_no_choice, pods=self.pods, nodes=self.nodes, settle=lambda _key: None)
        self.budgets = DisruptionBudgets()
        self.dra = FakeClaims()

    def add_node(self, node: dict[str, Any]) -> None:
        self.nodes[node["metadata"]["name"]] = node_facts(node)

    def add_pending(self, pod: dict[str, Any]) -> PodEntry:
        meta = pod["metadata"]
        key = pod_key(meta.get("namespace") or "default", meta["name"])
        entry = PodEntry(key, meta.get("uid") or "", "", True, None, None, b"", pod)
        self.pods[key] = entry
        return entry
