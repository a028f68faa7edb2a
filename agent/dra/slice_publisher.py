"""Keep the node's ResourceSlices equal to its pool, writing only when something changed.

A sync lists the slices of topoalloc's driver on this node and compares them with the slices the
pool needs at the generation they carry. Equal: nothing is written. Otherwise the pool generation
goes one past the highest seen, and every slice is written at it (the scheduler only trusts a pool
whose slices all name the same, highest, generation): updated in place, created where missing, and
slices the pool no longer needs deleted. A 409 re-lists and tries again; any other failure is
reported and the next pass retries. While the devices stay the same the server is re-read only
every `verify_seconds`, or sooner after `mark_stale` (kubelet deletes a node's slices when it
restarts or loses the plugin, so a new registration asks for a check).

Device taints: the API server's version says whether it keeps them (1.36 and later: DRADeviceTaints
is beta and on); where it does, a device tainted unhealthy stays in the slices, else it is left out.
A server of 1.36 that dropped the taints of a slice written (the gate turned off) is taken at its
word: the pool is written again without those devices, and taints are not tried again.

Shared GPUs the same way: from 1.36 (DRAConsumableCapacity beta and on) GPUs are published sharable
(`allowMultipleAllocations`, capacity with a requestPolicy); before, or where the server drops those
fields on write, whole (slices.whole), said once in the log and in a Warning Event on the Node. What
the slices hold is the fact the allocator reads: a GPU without `allowMultipleAllocations` is whole.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from agent.dra.slices import pool_slices, untainted, whole
from agent.events import post_event
from agent.kube import TRANSPORT_ERRORS, Kube, Outcome, short_error, status_of
from apis import dra
from apis.dra_taints import SERVED_SINCE_MINOR

log = logging.getLogger(__name__)

CONFLICT_RETRIES = 3
SHARING_SINCE_MINOR = 36  # DRAConsumableCapacity: beta and on from 1.36, alpha and off in 1.35
WHOLE_GPUS_REASON = "DRAGPUsWhole"


def _content(obj: dict[str, Any]) -> Any:
    """What a slice says, as far as this driver wrote it (fields the server adds do not count)."""
    spec = obj.get("spec") or {}
    pool = spec.get("pool") or {}
    owners = (obj.get("metadata") or {}).get("ownerReferences") or []
    return (
        [(o.get("kind"), o.get("name"), o.get("uid")) for o in owners],
        spec.get("driver"),
        spec.get("nodeName"),
        pool.get("name"),
        pool.get("generation"),
        pool.get("resourceSliceCount"),
        [
            (d.get("name"), d.get("attributes") or {}, d.get("capacity") or {}, _taints(d), _multiple(d))
            for d in spec.get("devices") or []
        ],
    )


def _taints(device: dict[str, Any]) -> list[tuple[Any, Any, Any]]:
    """A device's taints as written (timeAdded left out: the server may write it its own way)."""
    return [(t.get("key"), t.get("value") or "", t.get("effect")) for t in device.get("taints") or []]


def _multiple(device: dict[str, Any]) -> bool:
    return device.get(dra.ALLOW_MULTIPLE) is True


def _shared(obj: dict[str, Any]) -> list[bool]:
    return [_multiple(d) for d in (obj.get("spec") or {}).get("devices") or []]


def _device_taints(obj: dict[str, Any]) -> list[list[tuple[Any, Any, Any]]]:
    return [_taints(d) for d in (obj.get("spec") or {}).get("devices") or []]


def _minor(version: dict[str, Any]) -> int:
    """The minor release of a /version answer ("36", "36+" as some distributions say)."""
    digits = "".join(c for c in str(version.get("minor") or "") if c.isdigit())
    return int(digits) if digits else 0


class SlicePublisher:
    def __init__(
        self,
        kube: Kube,
        node: str,
        *,
        verify_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        taints: bool | None = None,
        sharing: bool | None = None,
    ) -> None:
        """`taints`, `sharing`: whether the server keeps device taints, consumable capacity (None:
        its version says)."""
        self.kube = kube
        self.taints = taints
        self.sharing = sharing
        self._told_whole = False
        self._why_whole = "the agent was told the API server does not serve consumable capacity"
        self.node = node
        self.verify_seconds = verify_seconds
        self.clock = clock
        self.generation = 0  # the pool generation last written or seen
        self._devices: tuple[list[dict[str, Any]], str] | None = None  # (devices, owner) on the server
        self._verified = float("-inf")
        self._dropped = False  # the last sync's writes lost their taints or their sharing
        self.writes = 0

    def mark_stale(self) -> None:
        self._verified = float("-inf")

    def publish(self, devices: list[dict[str, Any]], node_uid: str = "") -> Outcome:
        """Make the server hold the pool of `devices`, owned by the Node of UID `node_uid`."""
        wanted = (devices, node_uid)
        if wanted == self._devices and self.clock() - self._verified < self.verify_seconds:
            return Outcome()
        try:
            if self.taints is None or self.sharing is None:
                self._ask_version()
            outcome = self._sync(self._served(devices), node_uid)
            if self._dropped:  # the server said no taints or no sharing: written again without
                outcome = Outcome(wrote=self._sync(self._served(devices), node_uid).wrote or outcome.wrote)
            if not self.sharing:
                self._tell_whole(node_uid)
            self._devices = wanted
            return outcome
        except TRANSPORT_ERRORS as exc:
            self._devices = None  # unknown state: check on the next pass
            error = f"ResourceSlices of {self.node}: {short_error(exc)}"
            log.warning("%s", error)
            return Outcome(error=error)

    def _served(self, devices: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The pool as this server keeps it."""
        devices = devices if self.taints else untainted(devices)
        return devices if self.sharing else whole(devices)

    def _ask_version(self) -> None:
        minor = _minor(self.kube.server_version())
        if self.taints is None:
            self.taints = minor >= SERVED_SINCE_MINOR
            log.info(
                "API server 1.%d: an unhealthy device %s",
                minor,
                "stays in the ResourceSlices with a taint" if self.taints else "leaves the ResourceSlices",
            )
        if self.sharing is None:
            self.sharing = minor >= SHARING_SINCE_MINOR
            self._why_whole = f"the API server (1.{minor}) does not serve consumable capacity"
            if self.sharing:
                log.info("API server 1.%d: GPUs are published sharable (consumable capacity)", minor)

    def _tell_whole(self, node_uid: str) -> None:
        """Say once, in the log and a Warning Event on the Node, that the GPUs are whole only."""
        if self._told_whole:
            return
        message = (
            f"GPUs of node {self.node} are published whole only, not sharable ({self._why_whole}): "
            "claims asking for a share of a GPU cannot be served here"
        )
        log.warning("%s", message)
        involved = {"kind": "Node", "name": self.node, "uid": node_uid}
        post_event(self.kube, self.node, involved, "Warning", WHOLE_GPUS_REASON, message)
        self._told_whole = True

    def _sync(self, devices: list[dict[str, Any]], node_uid: str) -> Outcome:
        self._dropped = False
        outcome = Outcome()
        for attempt in range(CONFLICT_RETRIES):
            items = self.kube.list_resource_slices(self.node, dra.DRIVER).get("items") or []
            current = {s["metadata"]["name"]: s for s in items}
            seen = max(
                [self.generation] + [int((s["spec"].get("pool") or {}).get("generation") or 0) for s in items]
            )
            wanted = pool_slices(self.node, devices, seen, node_uid=node_uid)
            same = len(current) == len(wanted) and all(
                w["metadata"]["name"] in current and _content(current[w["metadata"]["name"]]) == _content(w)
                for w in wanted
            )
            try:
                if not same:
                    self._write(current, pool_slices(self.node, devices, seen + 1, node_uid=node_uid))
                    seen += 1
                    outcome.wrote = True
            except TRANSPORT_ERRORS as exc:
                if status_of(exc) in (404, 409) and attempt + 1 < CONFLICT_RETRIES:
                    log.info(
                        "ResourceSlices of %s changed under us (%d); re-listing", self.node, status_of(exc)
                    )
                    continue
                raise
            self.generation = seen
            self._verified = self.clock()
            return outcome
        return outcome

    def _write(self, current: dict[str, dict[str, Any]], wanted: list[dict[str, Any]]) -> None:
        names = set()
        for body in wanted:
            name = body["metadata"]["name"]
            names.add(name)
            old = current.get(name)
            if old is None:
                stored = self.kube.create_resource_slice(body)
            else:
                body["metadata"]["resourceVersion"] = old["metadata"].get("resourceVersion")
                stored = self.kube.replace_resource_slice(name, body)
            self.writes += 1
            if self.taints and _device_taints(body) != _device_taints(stored or body):
                log.warning(
                    "the API server dropped the device taints of ResourceSlice %s (DRADeviceTaints off): "
                    "unhealthy devices leave the slices instead",
                    name,
                )
                self.taints = False
                self._dropped = True
            if self.sharing and _shared(body) != _shared(stored or body):
                log.warning(
                    "the API server dropped allowMultipleAllocations from ResourceSlice %s "
                    "(DRAConsumableCapacity off): GPUs are published whole instead",
                    name,
                )
                self.sharing = False
                self._why_whole = "the API server dropped allowMultipleAllocations on write"
                self._dropped = True
        for name in sorted(set(current) - names):
            try:
                self.kube.delete_resource_slice(name)
            except TRANSPORT_ERRORS as exc:
                if status_of(exc) != 404:
                    raise
            self.writes += 1
        generation = wanted[0]["spec"]["pool"]["generation"]
        log.info(
            "ResourceSlices of %s: pool generation %d, %d devices in %d slices",
            self.node,
            generation,
            sum(len(s["spec"]["devices"]) for s in wanted),
            len(wanted),
        )
