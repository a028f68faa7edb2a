"""Bind: choose devices, hold them, POST pods/binding carrying `device-allocated`.

    reserve (cache, synchronous: the critical section) -> POST binding with the annotation
Only the reservation is serialised; the API call runs concurrently with other binds. The API
server writes a Binding's annotations onto the pod together with spec.nodeName, so one write
binds the pod with its devices, and a failed binding leaves nothing behind but the reservation,
which is rolled back. After a successful binding the reservation stays until the watch shows the
pod bound (then the pod's annotation holds the devices) or its TTL runs out. A binding whose
outcome is unknown (timeout) keeps the reservation for the same reason.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from allocator.extender.cache_view import ExtenderCache
from allocator.runtime.cache.records import Hold
from allocator.runtime.coreadapter import CoreAdapter, Rejection
from allocator.runtime.events import EventSink, PodRef
from allocator.runtime.kube import ApiError, KubeApi
from allocator.runtime.steering import NO_STEERING, Steering
from apis import keys
from apis.extender import ExtenderBindingArgs

log = logging.getLogger(__name__)

JSON = dict[str, Any]


@dataclass(frozen=True)
class BindOutcome:
    error: str = ""
    reason: str = "ok"  # metric label: a bounded set of values

    @property
    def ok(self) -> bool:
        return not self.error


class Binder:
    def __init__(
        self,
        api: KubeApi,
        cache: ExtenderCache,
        core: CoreAdapter,
        *,
        is_leader: Callable[[], bool],
        events: EventSink,
        steering: Steering = NO_STEERING,
        deadline: float = 4.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.cache = cache
        self.core = core
        self.is_leader = is_leader
        self.events = events
        self.steering = steering
        self.deadline = deadline
        self.clock = clock

    async def bind(self, args: ExtenderBindingArgs) -> BindOutcome:
        started = self.clock()
        if not self.is_leader():
            return BindOutcome("this allocator instance is not the leader", "not_leader")
        pod = await self._pod(args)
        if isinstance(pod, BindOutcome):
            return pod
        bound_to = (pod.get("spec") or {}).get("nodeName")
        if bound_to:
            if bound_to == args.node:
                return BindOutcome()  # a retried bind whose binding already landed (wire fact 9)
            return BindOutcome(f"pod is already bound to node {bound_to}", "already_bound")
        req = self.core.request(pod)
        if req.invalid is not None:
            self._event(pod, "FailedDeviceAllocation", req.invalid.message)
            return BindOutcome(req.invalid.message, "invalid_request")
        if not req.wants_devices:
            # A pod without devices has no reservation; gang scheduling may still hold it back.
            refusal = self.steering.bind_refusal(req, args.node)
            if refusal is not None:
                self._event(pod, "FailedBinding", refusal.message)
                return BindOutcome(refusal.message, "gang")
            return await self._post_binding(args, None)

        res = self.cache.ledger.reserve(pod, req, args.node)
        if isinstance(res, Rejection):
            self._event(pod, "FailedDeviceAllocation", f"node {args.node}: {res.explained}")
            return BindOutcome(f"node {args.node}: {res.explained}", "rejected")
        if self.clock() - started > self.deadline or not self.is_leader():
            # kube-scheduler has given up on this call (or we lost the lease): binding now would
            # race its retry. Undo instead.
            self.cache.ledger.release(res)
            why = "bind deadline exceeded" if self.is_leader() else "lost leadership during bind"
            return BindOutcome(why, "deadline" if self.is_leader() else "not_leader")
        return await self._post_binding(args, res, pod)

    async def _pod(self, args: ExtenderBindingArgs) -> JSON | BindOutcome:
        entry = self.cache.pod(args.pod_namespace, args.pod_name)
        if entry is not None and entry.raw is not None and (not args.pod_uid or entry.uid == args.pod_uid):
            return entry.raw  # pending: the cache has the whole pod
        # Not in the cache yet (watch lag), or the cache is behind: ask the API server.
        try:
            pod = await self.api.get_pod(args.pod_namespace, args.pod_name)
        except ApiError as exc:
            if exc.not_found:
                return BindOutcome(f"pod {args.pod_namespace}/{args.pod_name} not found", "pod_not_found")
            return BindOutcome(f"reading pod {args.pod_namespace}/{args.pod_name}: {exc}", "api_error")
        uid = (pod.get("metadata") or {}).get("uid") or ""
        if args.pod_uid and uid != args.pod_uid:
            return BindOutcome(
                f"pod {args.pod_namespace}/{args.pod_name} has uid {uid}, not {args.pod_uid}", "pod_not_found"
            )
        return pod

    async def _post_binding(
        self, args: ExtenderBindingArgs, res: Hold | None, pod: JSON | None = None
    ) -> BindOutcome:
        # The annotation travels in the Binding: the API server copies a Binding's annotations
        # onto the pod in the same write that sets spec.nodeName, so the pod is bound with its
        # devices or not at all, and there is nothing to undo when the binding fails.
        # An owner of a Reservation's room also gets reservation-allocated (res.extra).
        annotations = {keys.DEVICE_ALLOCATED: res.annotation, **res.extra} if res is not None else None
        try:
            await self.api.bind_pod(
                args.pod_namespace, args.pod_name, args.pod_uid, args.node, annotations=annotations
            )
        except ApiError as exc:
            if exc.status == 0:
                # Unknown outcome: keep the reservation; the watch confirms it or the TTL ends it.
                return BindOutcome(f"binding pod: {exc}", "binding_unknown")
            if exc.conflict and await self._bound_here(args):
                return BindOutcome()
            if res is not None:
                self.cache.ledger.release(res)
            return self._failed(pod, f"binding pod to {args.node}: {exc}", "binding_failed")
        return BindOutcome()

    async def _bound_here(self, args: ExtenderBindingArgs) -> bool:
        """After a 409: did an earlier attempt of ours already bind the pod to this node?"""
        try:
            pod = await self.api.get_pod(args.pod_namespace, args.pod_name)
        except ApiError:
            return False
        uid_ok = not args.pod_uid or (pod.get("metadata") or {}).get("uid") == args.pod_uid
        return uid_ok and (pod.get("spec") or {}).get("nodeName") == args.node

    def _failed(self, pod: JSON | None, message: str, reason: str) -> BindOutcome:
        if pod is not None:
            self._event(pod, "FailedBinding", message)
        return BindOutcome(message, reason)

    def _event(self, pod: JSON, reason: str, note: str) -> None:
        self.events.warn(PodRef.of(pod), reason, "Binding", note)
