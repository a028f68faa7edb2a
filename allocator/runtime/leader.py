"""Lease-based leader election (coordination.k8s.io/v1), client-go's algorithm on raw dicts.

Written here rather than taken from `kubernetes.aio.leaderelection`: that one crashes on the first
Lease create in 37.0.2 (python-stack-notes section 6), writes renewTime as `str(datetime)`, and
cannot release the Lease on shutdown, which makes every rolling update wait a full lease duration.

Safety comes from the API server: every write is a PUT carrying the resourceVersion we read, so
two candidates racing for an expired Lease get one 200 and one 409. Expiry is judged on the local
monotonic clock from the moment we last saw the record change (client-go's observedTime), so
clock skew between replicas does not matter.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from typing import Any

from allocator.runtime.config import LeaderElection
from allocator.runtime.kube import ApiError, KubeApi
from apis.timestamps import micro_time

log = logging.getLogger(__name__)

# On the leader's own pod (optional): a Service selecting it reaches the leader only.
LEADER_LABEL = "topoalloc.io/leader"


class LeaderElector:
    def __init__(
        self,
        api: KubeApi,
        config: LeaderElection,
        *,
        on_change: Callable[[bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not config.lease_duration > config.renew_deadline > config.retry_period > 0:
            raise ValueError("leader election needs lease_duration > renew_deadline > retry_period > 0")
        self.api = api
        self.config = config
        self.identity = config.identity
        self.on_change = on_change
        self.clock = clock
        self._leading = False
        self._renewed_at = 0.0  # clock() of our last successful write
        self._observed: tuple[str, str, str] | None = None  # (holder, renewTime, resourceVersion)
        self._observed_at = 0.0
        self.holder: str | None = None  # last holder seen in the Lease
        self._rng = random.Random()

    # -- state ------------------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        """True only while our last renewal is younger than renew_deadline: a leader whose renew
        loop stalls stops acting as leader before anyone else can take over."""
        return self._leading and self.clock() - self._renewed_at < self.config.renew_deadline

    def _set_leading(self, leading: bool) -> None:
        if leading == self._leading:
            return
        self._leading = leading
        log.info(
            "%s %s leadership of %s/%s",
            self.identity,
            "acquired" if leading else "lost",
            self.config.namespace,
            self.config.lease_name,
        )
        if self.on_change:
            self.on_change(leading)

    # -- loop -------------------------------------------------------------------------------------

    async def run(self) -> None:
        cfg = self.config
        while True:
            try:
                ok = await self.try_acquire_or_renew()
            except ApiError as exc:
                log.warning("leader election: %s", exc)
                ok = False
            if not ok and self._leading and self.clock() - self._renewed_at >= cfg.renew_deadline:
                self._set_leading(False)
            # Followers poll with jitter so candidates do not collide on every retry.
            period = cfg.retry_period if self._leading else cfg.retry_period * self._rng.uniform(1.0, 1.2)
            await asyncio.sleep(period)

    async def try_acquire_or_renew(self) -> bool:
        cfg = self.config
        now = micro_time()
        lease = await self.api.get_lease(cfg.namespace, cfg.lease_name)
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": cfg.lease_name, "namespace": cfg.namespace},
                "spec": self._spec(now, now, 0),
            }
            try:
                created = await self.api.create_lease(cfg.namespace, body)
            except ApiError as exc:
                if exc.conflict:  # AlreadyExists: another candidate created it first
                    return False
                raise
            self._won(created)
            return True

        spec: dict[str, Any] = lease.get("spec") or {}
        meta = lease.get("metadata") or {}
        holder = spec.get("holderIdentity") or ""
        record = (holder, str(spec.get("renewTime") or ""), str(meta.get("resourceVersion") or ""))
        if record != self._observed:
            self._observed = record
            self._observed_at = self.clock()
        self.holder = holder or None
        duration = float(spec.get("leaseDurationSeconds") or cfg.lease_duration)
        expired = self.clock() - self._observed_at >= duration
        if holder and holder != self.identity and not expired:
            self._set_leading(False)
            return False

        transitions = int(spec.get("leaseTransitions") or 0)
        if holder == self.identity:
            acquire = str(spec.get("acquireTime") or now)
        else:
            acquire = now
            transitions += 1
        lease["spec"] = self._spec(acquire, now, transitions)
        try:
            updated = await self.api.replace_lease(cfg.namespace, cfg.lease_name, lease)
        except ApiError as exc:
            if exc.conflict:
                return False
            raise
        self._won(updated)
        return True

    def _spec(self, acquire: str, renew: str, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": round(self.config.lease_duration),
            "acquireTime": acquire,
            "renewTime": renew,
            "leaseTransitions": transitions,
        }

    def _won(self, lease: dict[str, Any]) -> None:
        spec = lease.get("spec") or {}
        meta = lease.get("metadata") or {}
        self._observed = (
            self.identity,
            str(spec.get("renewTime") or ""),
            str(meta.get("resourceVersion") or ""),
        )
        self._observed_at = self._renewed_at = self.clock()
        self.holder = self.identity
        self._set_leading(True)

    async def release(self) -> None:
        """Give the Lease up (empty holder) so a standby takes over at its next retry instead of
        waiting out the lease duration."""
        if not self._leading:
            return
        self._set_leading(False)
        cfg = self.config
        try:
            lease = await self.api.get_lease(cfg.namespace, cfg.lease_name)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            now = micro_time()
            lease["spec"] = {
                **lease["spec"],
                "holderIdentity": "",
                "leaseDurationSeconds": 1,
                "renewTime": now,
            }
            await self.api.replace_lease(cfg.namespace, cfg.lease_name, lease)
            log.info("%s released %s/%s", self.identity, cfg.namespace, cfg.lease_name)
        except ApiError as exc:
            log.warning("releasing the lease: %s", exc)
