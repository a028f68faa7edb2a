"""An in-memory `ClaimsCache` (allocator/claims/cache_view.py) for unit tests of the DRA gate and
the claims controller's reading of pods: pending pods, Nodes, parsed claims, templates, classes and
published pools the test puts in, and the runtime's hold ledger over them (the claims controller
only holds devices the core chose already: the ledger's own choice is never asked for)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from allocator.core.claims.published import NodeDevices
from allocator.runtime.cache.dra import ClaimEntry
from allocator.runtime.cache.records import NodeFacts, PodEntry, node_facts, pod_key
from allocator.runtime.coreadapter import PodRequest, Rejection
from allocator.runtime.ledger import HoldLedger
from apis.annotations import DeviceAllocations
from apis.dra_claims import DeviceClass, ResourceClaim, ResourceClaimTemplate


def _no_choice(req: PodRequest, node: str) -> DeviceAllocations | Rejection:
    raise AssertionError(
        "the claims controller holds what the core chose; it never asks the ledger to choose"
    )


@dataclass
class FakeDra:
    claims: dict[str, ClaimEntry] = field(default_factory=dict)
    templates: dict[str, ResourceClaimTemplate | str] = field(default_factory=dict)
    classes: dict[str, DeviceClass | str] = field(default_factory=dict)
    published: dict[str, NodeDevices] = field(default_factory=dict)


class FakeClaimsCache:
    def __init__(self) -> None:
        self.pods: dict[str, PodEntry] = {}
        self.nodes: dict[str, NodeFacts] = {}
        self.podgroups: dict[str, dict[str, Any]] = {}
        self.native_podgroups: dict[str, dict[str, Any]] = {}
        self.workloads: dict[str, dict[str, Any]] = {}
        self.dra = FakeDra()
        self.ledger = HoldLedger(_no_choice, pods=self.pods, nodes=self.nodes, settle=lambda _key: None)

    def add_node(self, node: dict[str, Any]) -> None:
        self.nodes[node["metadata"]["name"]] = node_facts(node)

    def add_pending(self, pod: dict[str, Any]) -> PodEntry:
        meta = pod["metadata"]
        key = pod_key(meta.get("namespace") or "default", meta["name"])
        entry = PodEntry(key, meta.get("uid") or "", "", True, None, None, b"", pod)
        self.pods[key] = entry
        return entry

    def add_claim(self, obj: dict[str, Any]) -> ResourceClaim:
        claim = ResourceClaim.from_dict(obj)
        self.dra.claims[claim.key] = ClaimEntry(claim)
        return claim

    def add_template(self, obj: dict[str, Any]) -> ResourceClaimTemplate:
        tmpl = ResourceClaimTemplate.from_dict(obj)
        self.dra.templates[tmpl.key] = tmpl
        return tmpl
