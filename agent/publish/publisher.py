"""Write the Device CR and the Node's labels and extended resources, only when they change.

Write storms are avoided three ways: the desired content is compared with what the server holds
(ignoring `status.updateTime` and fields other writers own), load-only status changes are written
at most every `status_min_interval_seconds` (health changes go at once), and while nothing changes
the server is re-read only every `verify_seconds`. A 409 re-reads and retries; any other failure
is reported to the caller, which keeps its desired state and tries again on the next pass.

While nothing changes, `status.updateTime` is still written anew once it is `status_refresh`
seconds old (a heartbeat, as kubelet's node status report): a Device whose updateTime stays old
says its agent stopped publishing (`topoalloc doctor` judges it so).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from typing import Any

from agent.kube import TRANSPORT_ERRORS, Kube, Outcome, short_error, status_of
from agent.publish.device_builder import device_object
from apis.device import Device
from apis.timestamps import format_time, parse_time

log = logging.getLogger(__name__)

CONFLICT_RETRIES = 3


def _health_view(status: dict[str, Any]) -> Any:
    """The parts of a Device status whose change must be written at once."""
    return (
        status.get("summary"),
        [
            (d.get("type"), d.get("minor"), d.get("health"), d.get("reason"), d.get("lastXid"))
            for d in status.get("devices", [])
        ],
    )


def _status_content(status: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in status.items() if k in ("summary", "devices")}


def _update_time(status: dict[str, Any]) -> float:
    """A Device status's updateTime in seconds (-inf when it has none)."""
    stamp = parse_time(status.get("updateTime"))
    return float("-inf") if stamp is None else stamp


def _owner_refs(current: list[dict[str, Any]], wanted: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Keep other owners; make sure ours (matched by uid) is present."""
    out = [
        ref
        for ref in current
        if ref.get("kind") != "Node" or ref.get("name") != (wanted[0]["name"] if wanted else "")
    ]
    return out + wanted


class Publisher:
    def __init__(
        self,
        kube: Kube,
        node_name: str,
        *,
        owned_labels: tuple[str, ...] = (),
        owned_annotations: tuple[str, ...] = (),
        status_min_interval: float = 60.0,
        status_refresh: float = 300.0,
        verify_seconds: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kube = kube
        self.node_name = node_name
        self.status_min_interval = status_min_interval
        self.status_refresh = status_refresh  # 0: never written only to refresh updateTime
        self.verify_seconds = verify_seconds
        self.clock = clock
        self.owned_labels = owned_labels
        self.owned_annotations = owned_annotations
        self._last_spec: dict[str, Any] | None = None  # the desired object last known to be on the server
        self._last_status: dict[str, Any] | None = None
        self._last_verified = 0.0
        self._last_status_write = float("-inf")
        self._status_stamp = float("-inf")  # the server's status.updateTime, as last seen or written
        self.node: dict[str, Any] | None = None  # latest Node object read or returned by a patch
        self._node_read_at = float("-inf")
        self.writes = 0

    # -- Node -------------------------------------------------------------------------------
    def read_node(self, *, max_age: float = 60.0) -> dict[str, Any] | None:
        """The Node object, re-read when older than `max_age`; None while it cannot be read."""
        now = self.clock()
        if self.node is not None and now - self._node_read_at < max_age:
            return self.node
        try:
            self.node = self.kube.get_node(self.node_name)
            self._node_read_at = now
        except TRANSPORT_ERRORS as exc:
            log.warning("cannot read Node %s: %s", self.node_name, short_error(exc))
            if status_of(exc) == 404:
                self.node = None
        return self.node

    def node_uid(self) -> str:
        return str(((self.node or {}).get("metadata") or {}).get("uid", ""))

    def publish_node(self, labels: dict[str, str | None], extended: dict[str, str | None]) -> Outcome:
        """Patch the Node's labels and status capacity/allocatable where they differ (None = remove)."""
        node = self.read_node()
        if node is None:
            return Outcome(error=f"Node {self.node_name} not readable")
        outcome = Outcome()
        current_labels = (node.get("metadata") or {}).get("labels") or {}
        label_patch = {
            k: v
            for k, v in labels.items()
            if current_labels.get(k) != v and not (v is None and k not in current_labels)
        }
        status = node.get("status") or {}
        capacity, allocatable = status.get("capacity") or {}, status.get("allocatable") or {}
        resource_patch = {
            k: v
            for k, v in extended.items()
            if (capacity.get(k) != v or allocatable.get(k) != v)
            and not (v is None and k not in capacity and k not in allocatable)
        }
        try:
            if label_patch:
                self.node = self.kube.patch_node(self.node_name, {"metadata": {"labels": label_patch}})
                self._node_read_at = self.clock()
                outcome.wrote = True
                self.writes += 1
                log.info("Node %s labels: %s", self.node_name, label_patch)
            if resource_patch:
                self.node = self.kube.patch_node_status(
                    self.node_name, {"status": {"capacity": resource_patch, "allocatable": resource_patch}}
                )
                self._node_read_at = self.clock()
                outcome.wrote = True
                self.writes += 1
                log.info("Node %s resources: %s", self.node_name, resource_patch)
        except TRANSPORT_ERRORS as exc:
            outcome.error = f"Node {self.node_name}: {short_error(exc)}"
            self._node_read_at = float("-inf")  # re-read before the next attempt
            log.warning("%s", outcome.error)
        return outcome

    # -- Device -----------------------------------------------------------------------------
    def publish_device(self, device: Device) -> Outcome:
        desired = device_object(device)
        status = desired.pop("status", {})
        now = self.clock()
        if (
            desired == self._last_spec
            and _status_content(status) == self._last_status
            and now - self._last_verified < self.verify_seconds
            and not self._refresh_due(now)
        ):
            return Outcome()
        try:
            return self._sync(desired, status, now)
        except TRANSPORT_ERRORS as exc:
            error = f"Device {desired['metadata']['name']}: {short_error(exc)}"
            log.warning("%s", error)
            self._last_spec = None  # unknown state: verify on the next pass
            return Outcome(error=error)

    def _sync(self, desired: dict[str, Any], status: dict[str, Any], now: float) -> Outcome:
        name = desired["metadata"]["name"]
        outcome = Outcome()
        for attempt in range(CONFLICT_RETRIES):
            try:
                current = self.kube.get_device(name)
            except TRANSPORT_ERRORS as exc:
                if status_of(exc) != 404:
                    raise
                current = self.kube.create_device(desired)
                self.writes += 1
                outcome.wrote = True
                log.info("Device %s created", name)
            merged = self._merge(current, desired)
            try:
                if merged is not None:
                    current = self.kube.replace_device(name, merged)
                    self.writes += 1
                    outcome.wrote = True
                    log.info("Device %s spec/metadata updated", name)
                if self._status_due(current.get("status") or {}, status, now):
                    body = copy.deepcopy(current)
                    kept = {k: v for k, v in (current.get("status") or {}).items() if k == "allocations"}
                    body["status"] = {**kept, **status, "updateTime": format_time(now)}
                    self.kube.replace_device_status(name, body)
                    self.writes += 1
                    outcome.wrote = True
                    self._last_status_write = self._status_stamp = now
                    log.info("Device %s status updated", name)
                    self._last_status = _status_content(status)
                else:
                    self._last_status = _status_content(current.get("status") or {})
                    self._status_stamp = _update_time(current.get("status") or {})
            except TRANSPORT_ERRORS as exc:
                if status_of(exc) == 409 and attempt + 1 < CONFLICT_RETRIES:
                    log.info("Device %s changed under us (409); re-reading", name)
                    continue
                raise
            self._last_spec = desired
            self._last_verified = now
            return outcome
        return outcome

    def _merge(self, current: dict[str, Any], desired: dict[str, Any]) -> dict[str, Any] | None:
        """The object to PUT, or None when the server already holds what we want.

        Labels and annotations of other writers are kept; ours are set. The spec is ours."""
        meta = current.get("metadata") or {}
        want = desired["metadata"]
        labels = {k: v for k, v in (meta.get("labels") or {}).items() if k not in self.owned_labels}
        labels.update(want.get("labels", {}))
        annotations = {
            k: v for k, v in (meta.get("annotations") or {}).items() if k not in self.owned_annotations
        }
        annotations.update(want.get("annotations", {}))
        owners = _owner_refs(meta.get("ownerReferences") or [], want.get("ownerReferences") or [])
        same = (
            current.get("spec") == desired.get("spec")
            and (meta.get("labels") or {}) == labels
            and (meta.get("annotations") or {}) == annotations
            and (meta.get("ownerReferences") or []) == owners
        )
        if same:
            return None
        body = copy.deepcopy(current)
        body["metadata"] = {**meta, "labels": labels, "annotations": annotations}
        if owners:
            body["metadata"]["ownerReferences"] = owners
        body["spec"] = desired.get("spec", {})
        body.pop("status", None)
        return body

    def _refresh_due(self, now: float) -> bool:
        return self.status_refresh > 0 and now - self._status_stamp >= self.status_refresh

    def _status_due(self, current: dict[str, Any], desired: dict[str, Any], now: float) -> bool:
        if _status_content(current) == _status_content(desired):
            self._status_stamp = _update_time(current)
            return self._refresh_due(now)
        if _health_view(current) != _health_view(desired):
            return True  # health changes are never delayed
        return now - self._last_status_write >= self.status_min_interval
