"""The watch cache's DRA part: ResourceClaims, ResourceClaimTemplates, DeviceClasses and
ResourceSlices (resource.k8s.io/v1), parsed once per version.

What it feeds the core: every claim allocated with topoalloc.io devices, by topoalloc or by
kube-scheduler's own allocator, counts as used on its node (under `claim:<namespace>/<name>`, the
way a bound pod's device-allocated annotation counts), so no device is handed out twice. A claim
being written holds its devices in the hold ledger until the watch shows it allocated; then its
own entry takes over. What the claims controller reads: the parsed objects (or why one does not
decode) and each DRA node's published devices (its pool's complete, newest slices).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from allocator.core.claims.published import NodeDevices, pool_devices
from allocator.core.request.usage import claim_usage_key
from allocator.runtime.coreadapter import CoreAdapter, PodUsage
from allocator.runtime.ledger import HoldLedger
from apis import dra
from apis.dra_claims import DeviceClass, ResourceClaim, ResourceClaimTemplate
from apis.dra_slices import ResourceSlice
from apis.errors import CodecError

log = logging.getLogger(__name__)

JSON = dict[str, Any]


@dataclass
class ClaimEntry:
    claim: ResourceClaim | None  # None: it does not decode (`error` says why)
    error: str = ""
    usage: PodUsage | None = None  # what its topoalloc.io results take, once allocated


class DraStore:
    def __init__(
        self,
        core: CoreAdapter,
        ledger: HoldLedger,
        *,
        settle: Callable[[str], None],
        notify: Callable[[str, str, JSON | None], None],
    ) -> None:
        self.core = core
        self.ledger = ledger
        self.settle = settle  # the cache's: make the core count a key's entry
        self.notify = notify
        self.claims: dict[str, ClaimEntry] = {}
        self.templates: dict[str, ResourceClaimTemplate | str] = {}  # str: why it does not decode
        self.classes: dict[str, DeviceClass | str] = {}
        self.slices: dict[str, ResourceSlice] = {}  # topoalloc.io's only, by slice name
        self.published: dict[str, NodeDevices] = {}  # node -> its complete pool
        self._pools: dict[str, set[str]] = defaultdict(set)  # pool -> slice names
        self._on_node: dict[str, set[str]] = defaultdict(set)  # node -> claim keys counted there

    def store(self, kind: str) -> dict[str, Any]:
        return {
            "ResourceClaim": self.claims,
            "ResourceClaimTemplate": self.templates,
            "DeviceClass": self.classes,
            "ResourceSlice": self.slices,
        }[kind]

    # -- watch events -----------------------------------------------------------------------------

    def upsert(self, kind: str, key: str, obj: JSON) -> None:
        if kind == "ResourceClaim":
            self._upsert_claim(key, obj)
        elif kind == "ResourceClaimTemplate":
            self.templates[key] = _parsed(ResourceClaimTemplate.from_dict, obj, kind, key)
        elif kind == "DeviceClass":
            self.classes[key] = _parsed(DeviceClass.from_dict, obj, kind, key)
        elif kind == "ResourceSlice":
            self._upsert_slice(key, obj)
        self.notify(kind, key, obj)

    def delete(self, kind: str, key: str) -> None:
        store = self.store(kind)
        if key not in store:
            return
        if kind == "ResourceClaim":
            self._count(key, None)  # before it goes: the core stops counting it
        old = store.pop(key)
        if kind == "ResourceSlice":
            self._pools[old.pool].discard(key)
            self._refresh_pool(old.pool, old.node)
        self.notify(kind, key, None)

    def _upsert_claim(self, key: str, obj: JSON) -> None:
        entry = self.claims.get(key)
        try:
            claim = ResourceClaim.from_dict(obj, earlier=entry.claim if entry is not None else None)
        except CodecError as exc:
            log.warning("ResourceClaim %s does not decode: %s", key, exc)
            self._count(key, None)
            self.claims[key] = ClaimEntry(None, str(exc))
            return
        if entry is None or entry.claim is None or entry.claim.uid != claim.uid:
            if entry is not None:
                self._count(key, None)  # another claim of that name: the old one's devices go
            entry = self.claims[key] = ClaimEntry(claim)
        entry.claim = claim
        self._count(key, claim)

    def _count(self, key: str, claim: ResourceClaim | None) -> None:
        """Make the core count what the claim's topoalloc.io results take (nothing for none)."""
        entry = self.claims.get(key)
        usage = None
        if claim is not None and claim.allocation is not None:
            usage = self._usage(key, claim)
        old = entry.usage if entry is not None else None
        if entry is not None:
            entry.usage = usage
        if old is not None:
            self._on_node[old.node].discard(key)
        if usage is not None:
            self._on_node[usage.node].add(key)
        core_key = claim_usage_key(key)
        held = self.ledger.holds.get(core_key)
        if held is not None and usage is not None:
            self.ledger.drop(core_key)  # written: its own entry takes over from the hold
        if old != usage or held is not None:
            self.settle(core_key)

    def _usage(self, key: str, claim: ResourceClaim) -> PodUsage | None:
        assert claim.allocation is not None
        ours = [r for r in claim.allocation.results if r.driver == dra.DRIVER]
        if not ours or claim.annotation(dra.ANNOUNCES_ANNOTATION):  # no use: another claim's device
            return None
        pool = ours[0].pool
        node = claim.allocation.node or pool
        allocations, missing = self.core.claim_usage(node, pool, ours)
        if missing:
            log.warning("claim %s: devices %s of node %s not counted (not in its Device)", key, missing, node)
        return PodUsage(claim_usage_key(key), node, allocations, 0, 0, 0, 0)

    def usage(self, core_key: str) -> PodUsage | None:
        """The claim's usage for a `claim:` key (None for any other key)."""
        entry = self.claims.get(core_key.removeprefix("claim:")) if core_key.startswith("claim:") else None
        return entry.usage if entry is not None else None

    def node_changed(self, node: str) -> None:
        """The node's Device changed: read its claims' devices against it again."""
        for key in list(self._on_node.get(node, ())):
            entry = self.claims.get(key)
            if entry is not None:
                self._count(key, entry.claim)

    def _upsert_slice(self, key: str, obj: JSON) -> None:
        try:
            parsed = ResourceSlice.from_dict(obj)
        except CodecError as exc:
            log.warning("ResourceSlice %s does not decode: %s", key, exc)
            parsed = None
        old = self.slices.pop(key, None)
        if old is not None:
            self._pools[old.pool].discard(key)
            if parsed is None or old.pool != parsed.pool:
                self._refresh_pool(old.pool, old.node)
        if parsed is None or parsed.driver != dra.DRIVER:
            return
        self.slices[key] = parsed
        self._pools[parsed.pool].add(key)
        self._refresh_pool(parsed.pool, parsed.node)

    def _refresh_pool(self, pool: str, node: str) -> None:
        node = node or pool
        found = pool_devices(pool, (self.slices[n] for n in self._pools.get(pool, ())))
        if found is None:
            self.published.pop(node, None)
        else:
            self.published[node] = found


def _parsed(parse: Callable[[Any], Any], obj: JSON, kind: str, key: str) -> Any:
    try:
        return parse(obj)
    except CodecError as exc:
        log.warning("%s %s does not decode: %s", kind, key, exc)
        return str(exc)
