"""The hold ledger: devices held for a pod beyond what the pod itself says it holds.

The watch cache counts what bound pods hold (their `device-allocated` annotation); the ledger
keeps everything else that takes devices, per pod key, as a `Hold` (its `holds`):
  * a *bind hold* holds what bind chose, from the moment of choice until the watch shows
    the pod bound (the pod's own entry takes over), the bind fails (rolled back) or the TTL passes;
  * a *planned hold* (`hold`) is a hold without TTL made for someone else than bind: gang scheduling
    holds a member's planned devices from the moment its gang is planned until the member shows up
    bound or the gang drops the hold (allocator/gang/holds.py). Bind then takes the held devices,
    and asks `guard` (gang scheduling's `bind_refusal`, plugged in by allocator/assembly.py) whether
    it may bind the pod to that node at all.
  * a *room* (`hold_room`) is what a placed Reservation still holds on its node (room held for
    pods not created yet, allocator/reservations): no pod, no TTL, replaced whenever its owners
    take from it, dropped when the Reservation ends. Bind asks `placer` first: an owner of a room
    gets its devices from the room (and the binding's extra annotations with them).
  * a *claim hold* (`hold_claim`) holds the devices the claims controller chose for a
    ResourceClaim (key `claim:<namespace>/<name>`) while it writes the claim's allocation, until the
    watch shows the claim allocated (the cache drops the hold then: the claim's own entry counts)
    or the controller drops it (the write failed).
  * a *hold ahead* (`reserve_ahead`) holds what was chosen for a pod not created yet (placement
    decides at admission, when the pod has no uid and often no name yet): keyed by a token of
    its own (`admission:<n>`), until the pod shows up in the watch carrying that allocation
    (`adopt`: the hold becomes the pod's, under its key) or its TTL passes (the creation was
    refused after admission).

Every change of an entry is handed to `settle(key)` (the cache's: it makes the core count the
pod's hold, else its own entry). All methods are synchronous and the process runs one
event loop: a method runs to completion before any other request or watch event is looked at, so
choose-and-reserve in `reserve()` is a critical section without a lock, and as short as the
core's `allocate()`.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import time
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass, field

from allocator.core.request.pod_request import renamed
from allocator.runtime.cache.records import (
    JSON,
    Hold,
    PodEntry,
    meta_of,
    pod_key,
    requests_digest,
)
from allocator.runtime.coreadapter import NOT_IN_CACHE, PodRequest, Rejection
from allocator.runtime.metrics import Metrics
from apis.annotations import DeviceAllocations

log = logging.getLogger(__name__)

# The core's bind-time choice of devices (`CoreAdapter.allocate`).
Allocate = Callable[[PodRequest, str], "DeviceAllocations | Rejection"]
# Why a pod must not be bound to a node now (None: go ahead); gang scheduling's `bind_refusal`.
BindGuard = Callable[[PodRequest, str], "Rejection | None"]
ROOM_HOLDER = "reservation"  # the holder of every room entry
AHEAD = "admission:"  # the key prefix of holds ahead (no pod's key: a pod name has no colon)


@dataclass(frozen=True)
class Placed:
    """A bind's devices chosen by someone else than the core's plain choice (a room's owner)."""

    allocations: DeviceAllocations
    room: str = ""  # the Reservation whose room it takes from
    annotations: Mapping[str, str] = field(default_factory=dict)  # written beside device-allocated


# The devices of a pod on a node when it owns a room there; None: the plain choice decides. The
# last argument is the key the hold will have (the pod's, or a hold ahead's).
Placer = Callable[[JSON, PodRequest, str, str], "Placed | Rejection | None"]


def no_placer(pod: JSON, req: PodRequest, node: str, key: str) -> Placed | Rejection | None:
    """The placer without Reservations: every bind takes the core's plain choice."""
    return None


def no_refusal(req: PodRequest, node: str) -> Rejection | None:
    """The bind guard without gang scheduling: every bind may go ahead."""
    return None


class HoldLedger:
    def __init__(
        self,
        allocate: Allocate,
        *,
        pods: Mapping[str, PodEntry],
        nodes: Container[str],
        settle: Callable[[str], None],
        move: Callable[[str, str], None] | None = None,
        ttl: float = 120.0,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`pods` and `nodes`: the watch cache's (read, never written here)."""
        self.allocate = allocate
        self.pods = pods
        self.nodes = nodes
        self.settle = settle
        # Count what `old` holds under `new` without settling either (`adopt`, same request).
        self.move = move
        self.ttl = ttl
        self.metrics = metrics
        self.clock = clock
        self.holds: dict[str, Hold] = {}
        # Why a pod must not be bound to a node now (gang scheduling's, set at wiring time).
        self.guard: BindGuard = no_refusal
        # An owner's devices from its room (Reservations', set at wiring time).
        self.placer: Placer = no_placer
        # Told of every entry that goes (Reservations recount the room a failed bind took from).
        self.on_drop: list[Callable[[Hold], None]] = []
        # Told of every hold ahead adopted by its pod (the old key, the hold under the pod's key).
        self.on_move: list[Callable[[str, Hold], None]] = []
        # Holds ahead by (node, device-allocated JSON): how an arriving pod finds its own.
        self.ahead: dict[tuple[str, str], list[str]] = {}
        self._tokens = itertools.count(1)

    # -- the bind path ---------------------------------------------------------------------------

    def reserve(self, pod: JSON, req: PodRequest, node: str, *, holder: str = "") -> Hold | Rejection:
        """Choose devices for `pod` on `node` and hold them (kube-scheduler's "assume"): until
        bound or the TTL, or, for a `holder` (placement, choosing ahead of kube-scheduler), until
        bound or dropped (`drop_hold`).

        Synchronous from choice to hold: no other bind can run in between."""
        meta = meta_of(pod)
        key = pod_key(meta.get("namespace") or "default", meta.get("name") or "")
        held = self.holds.get(key)
        if held is not None and held.holder and not held.binding:
            refusal = self.guard(req, node)
            if refusal is not None:
                return refusal
            held.binding = True
            return held
        if held is not None:
            return Rejection("topoalloc: bind in progress", "another bind of this pod is in progress")
        if node not in self.nodes:
            return NOT_IN_CACHE
        entry = self.pods.get(key)
        if entry is not None and entry.holds:
            return Rejection("topoalloc: already bound", f"pod is already bound to {entry.node}", True)
        return self._choose(pod, req, node, key, meta.get("uid") or "", holder, math.inf if holder else None)

    def reserve_ahead(
        self, pod: JSON, req: PodRequest, node: str, *, holder: str, ttl: float
    ) -> Hold | Rejection:
        """Choose devices on `node` for a pod being admitted (no uid, maybe no name) and hold them
        under a key of their own until the pod shows up carrying them (`adopt`) or `ttl` passes."""
        if node not in self.nodes:
            return NOT_IN_CACHE
        key = f"{AHEAD}{next(self._tokens)}"
        got = self._choose(pod, req, node, key, "", holder, self.clock() + ttl)
        if isinstance(got, Hold):
            got.shape = requests_digest(pod.get("spec") or {})
        return got

    def _choose(
        self, pod: JSON, req: PodRequest, node: str, key: str, uid: str, holder: str, until: float | None
    ) -> Hold | Rejection:
        refusal = self.guard(req, node)
        if refusal is not None:
            return refusal
        placed = self.placer(pod, req, node, key)
        if isinstance(placed, Rejection):
            return placed
        chosen = self.allocate(req, node) if placed is None else placed.allocations
        if isinstance(chosen, Rejection):
            return chosen
        res = Hold(
            token=next(self._tokens),
            key=key,
            uid=uid,
            node=node,
            allocations=chosen,
            annotation=chosen.to_json(),
            request=req,
            expires=self.clock() + self.ttl if until is None else until,
            holder=holder,
            room=placed.room if placed is not None else "",
            extra=placed.annotations if placed is not None else {},
        )
        self._add(res)
        return res

    def adopt(
        self, key: str, uid: str, node: str, annotation: str, shape: bytes, request: Callable[[], PodRequest]
    ) -> Hold | None:
        """The pod `key` arrived carrying an allocation for `node` made ahead (`reserve_ahead`): the
        hold ahead becomes the pod's, under its key, so it counts as any placed pod's hold. Holds
        ahead are found by node and allocation: no two hold the same device, except shares of one
        GPU, told apart by the pods' requests. `shape`: the pod's `requests_digest`; unless the
        hold was made for the same (a later webhook changed the pod), the pod's own `request` is
        parsed and counted. None: no hold ahead carries it."""
        found = self.ahead.get((node, annotation))
        if not found or key in self.holds:
            return None
        olds = [self.holds[k] for k in found]
        old = next((h for h in olds if h.shape == shape), None)
        if old is not None:
            meta = key.split("/", 1)
            req = renamed(old.request, key=key, namespace=meta[0], name=meta[-1], uid=uid)
        else:
            req = request()
            old = next((h for h in olds if _same_size(h.request, req)), olds[0])
        new = dataclasses.replace(old, key=key, uid=uid, request=req, expires=math.inf, shape=b"")
        if self.move is not None and old.shape == shape:
            self.move(old.key, key)  # the same devices, made for the same request: only the key changes
        self.drop(old.key, quiet=True)
        self.settle(old.key)
        self._add(new)
        for listener in self.on_move:
            listener(old.key, new)
        return new

    def release(self, res: Hold) -> bool:
        """Roll back `res` if it is still the pod's current hold. A planned one stays held
        (its holder's plan stands; bind may be tried again): only its bind is over."""
        current = self.holds.get(res.key)
        if current is None or current.token != res.token:
            return False
        if current.holder:
            current.binding = False
            return True
        self.drop(res.key)
        self.settle(res.key)
        return True

    # -- holds (gang plans) ----------------------------------------------------------------------

    def hold(
        self, key: str, uid: str, node: str, allocations: DeviceAllocations, req: PodRequest, holder: str
    ) -> Hold | str:
        """Hold devices for the pending pod `key` on `node` on behalf of `holder`, until the pod is
        bound there or `drop_hold`. Refused (the reason) while the pod is bound or another
        hold has it."""
        entry = self.pods.get(key)
        if entry is None or entry.uid != uid or entry.node or not entry.active:
            return "the pod is gone, bound or finished"
        if key in self.holds or node not in self.nodes:
            return "the pod or its node is busy"
        return self._hold_until_released(key, uid, node, allocations, req, holder)

    def hold_claim(
        self, key: str, uid: str, node: str, allocations: DeviceAllocations, req: PodRequest, holder: str
    ) -> Hold | str:
        """Hold devices for the ResourceClaim counted under `key` on `node` while its allocation is
        written (no TTL: the cache or the holder ends it). `req` carries no cpu or memory: those are
        the pod's, counted when it binds. Refused (the reason) while another entry holds the key."""
        if key in self.holds or node not in self.nodes:
            return "the claim or its node is busy"
        return self._hold_until_released(key, uid, node, allocations, req, holder)

    def _hold_until_released(
        self, key: str, uid: str, node: str, allocations: DeviceAllocations, req: PodRequest, holder: str
    ) -> Hold:
        res = Hold(
            token=next(self._tokens),
            key=key,
            uid=uid,
            node=node,
            allocations=allocations,
            annotation=allocations.to_json(),
            request=req,
            expires=math.inf,  # its holder releases it, not the TTL
            holder=holder,
        )
        self._add(res)
        return res

    def drop_hold(self, key: str, *, force: bool = False) -> bool:
        """Drop a hold unless its bind is under way (that bind ends in a binding or in a rollback
        that leaves the hold to its holder again); `force` drops it anyway (leadership lost, or a
        bind that never finished)."""
        res = self.holds.get(key)
        if res is None or not res.holder or (res.binding and not force):
            return False
        self.drop(key)
        self.settle(key)
        return True

    # -- rooms (Reservations) --------------------------------------------------------------------

    def hold_room(self, key: str, node: str, allocations: DeviceAllocations, req: PodRequest) -> None:
        """Hold (or hold anew, with what is left of it) a Reservation's room on `node`; `req`
        carries its cpu and memory."""
        old = self.holds.get(key)
        same = (node, allocations.to_json(), req.cpu_milli, req.memory)
        if old is not None and (old.node, old.annotation, old.request.cpu_milli, old.request.memory) == same:
            return  # nothing changed: the core keeps counting it as it is
        res = Hold(
            token=next(self._tokens),
            key=key,
            uid="",
            node=node,
            allocations=allocations,
            annotation=allocations.to_json(),
            request=req,
            expires=math.inf,
            holder=ROOM_HOLDER,
        )
        self._add(res)

    def drop_room(self, key: str) -> bool:
        res = self.holds.get(key)
        if res is None or res.holder != ROOM_HOLDER:
            return False
        self.drop(key)
        self.settle(key)
        return True

    # -- upkeep ----------------------------------------------------------------------------------

    def expire(self) -> int:
        """Roll back the bind holds whose TTL has passed; how many there were."""
        now = self.clock()
        expired = [r for r in self.holds.values() if r.expires <= now]
        for res in expired:
            if res.key.startswith(AHEAD):
                # Its creation was refused after admission (a later webhook, quota, validation).
                log.info("hold ahead on %s expired: no pod showed up carrying it", res.node)
                self.drop(res.key)
                self.settle(res.key)
                continue
            log.warning("bind hold of %s on %s expired: the pod never showed up bound", res.key, res.node)
            self.release(res)
        if expired and self.metrics:
            self.metrics.reservations_expired.inc(len(expired))
        return len(expired)

    def drop(self, key: str, *, quiet: bool = False) -> None:
        """Forget the pod's entry without settling it: the cache does, once it has taken in the
        change that ended it (the pod bound, finished, deleted or replaced). `quiet`: the entry
        lives on under another key (`adopt`), so `on_drop` is not told."""
        res = self.holds.pop(key, None)
        if res is not None:
            if key.startswith(AHEAD):
                found = self.ahead.get((res.node, res.annotation), [])
                if key in found:
                    found.remove(key)
                if not found:
                    self.ahead.pop((res.node, res.annotation), None)
            self._gauge()
            if not quiet:
                for listener in self.on_drop:
                    listener(res)

    def _add(self, res: Hold) -> None:
        self.holds[res.key] = res
        if res.key.startswith(AHEAD):
            self.ahead.setdefault((res.node, res.annotation), []).append(res.key)
        self.settle(res.key)
        self._gauge()

    def _gauge(self) -> None:
        if self.metrics:
            self.metrics.reservations.set(len(self.holds))


def _same_size(a: PodRequest, b: PodRequest) -> bool:
    return (a.cpu_milli, a.memory) == (b.cpu_milli, b.memory)
