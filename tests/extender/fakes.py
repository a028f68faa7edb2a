"""An in-memory `ExtenderCache` (allocator/extender/cache_view.py) for unit tests of the extender:
pending pods the test puts in, and the runtime's hold ledger over them, whose core choice is a
function the test gives (no watch cache, no core state)."""

from __future__ import annotations

from typing import Any

from allocator.runtime.cache.budgets import DisruptionBudgets
from allocator.runtime.cache.records import PodEntry, pod_key
from allocator.runtime.ledger import Allocate, HoldLedger


class FakeExtenderCache:
    def __init__(self, nodes: set[str], choose: Allocate) -> None:
        self.pods: dict[str, PodEntry] = {}
        self.settled: list[str] = []  # keys the ledger asked the cache to recount
        self.ledger = HoldLedger(choose, pods=self.pods, nodes=nodes, settle=self.settled.append)
        self.budgets = DisruptionBudgets()

    def pod(self, namespace: str, name: str) -> PodEntry | None:
        return self.pods.get(pod_key(namespace, name))

    def add_pending(self, pod: dict[str, Any]) -> PodEntry:
        meta = pod["metadata"]
        key = pod_key(meta.get("namespace") or "default", meta["name"])
        entry = PodEntry(key, meta.get("uid") or "", "", True, None, None, b"", pod)
        self.pods[key] = entry
        return entry
