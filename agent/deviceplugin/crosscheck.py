"""After admission: compare what kubelet really assigned (PodResources API) with the annotations.

For every pod on this node that kubelet lists with devices of a served resource, each container's
kubelet IDs must be the ones its annotation gives it (expectation.py). A container that differs is
a Warning Event (`DeviceAllocationMismatch`) and a metric, and for GPUs the pod's `device-allocated`
annotation is rewritten to what kubelet assigned, so the allocator's cache counts the devices that
are really in use. RDMA mismatches are reported but not rewritten: kubelet's IDs name the NIC, not
the VF, so the truth about the VF is not known here.

Admission names the pod from the same list, so with topoalloc as the only plugin for these
resources nothing should differ; this catches another plugin serving them, a kubelet that lost its
state, and hand edits. A pod whose devices the node chose is compared with what the node chose
(its annotation may not be written yet: node_writes.py); an annotation made for another node
(`allocated-node`) is no allocation here. A rewritten annotation names this node as
`allocated-node`.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.deviceplugin.admission import Admission, Refused
from agent.deviceplugin.events import MISMATCHES, NO_EVENTS, EventSink
from agent.deviceplugin.expectation import ExpectationError, container_requests, expectations
from agent.deviceplugin.identity import pod_key
from agent.deviceplugin.inventory import SERVED_RESOURCES, Inventory, base_of
from agent.deviceplugin.podresources import PodResourcesClient, PodResourcesError
from apis import keys
from apis import resources as rn
from apis.annotations import (
    DeviceAllocation,
    DeviceAllocations,
    allocated_elsewhere,
    parse_device_allocated,
)
from apis.errors import CodecError
from apis.quantity import Format, Quantity

log = logging.getLogger(__name__)

MISMATCH_REASON = "DeviceAllocationMismatch"


@dataclass(frozen=True)
class Mismatch:
    pod: str
    resource: str
    container: str
    kubelet: tuple[str, ...]
    reason: str


def _truth_entries(
    resource: str, kubelet_ids: list[str], inv: Inventory, template: list[DeviceAllocation]
) -> list[DeviceAllocation] | None:
    """GPU annotation entries for what kubelet assigned; None when an ID is not one of ours."""
    units: dict[str, int] = {}
    for device_id in kubelet_ids:
        base = base_of(resource, device_id)
        units[base] = units.get(base, 0) + 1
    out = []
    for i, (uuid, n) in enumerate(units.items()):
        gpu = inv.gpu_by_uuid(uuid)
        if gpu is None:
            return None
        core = 100 if resource == rn.NVIDIA_GPU else n
        entry = (
            copy.deepcopy(template[min(i, len(template) - 1)]) if template else DeviceAllocation(gpu.minor)
        )
        entry.minor, entry.id = gpu.minor, gpu.uuid
        res = dict(entry.resources or {})
        res[rn.GPU_CORE] = Quantity.of(core)
        if rn.GPU_MEMORY_RATIO not in res or resource == rn.NVIDIA_GPU:
            res[rn.GPU_MEMORY_RATIO] = Quantity.of(core)
        if rn.GPU_MEMORY not in res or resource == rn.NVIDIA_GPU:
            res[rn.GPU_MEMORY] = Quantity.of(
                gpu.memory * res[rn.GPU_MEMORY_RATIO].value() // 100, Format.BINARY_SI
            )
        entry.resources = res
        out.append(entry)
    return out


class CrossChecker:
    def __init__(
        self,
        *,
        client: PodResourcesClient,
        admission: Admission,
        patch_annotation: Callable[[str, str, str], None] | None = None,
        events: EventSink = NO_EVENTS,
    ) -> None:
        self.client = client
        self.admission = admission
        self.patch_annotation = patch_annotation  # (namespace, name, device-allocated JSON)
        self.events = events
        self.mismatches: list[Mismatch] = []
        self.corrected = 0
        self.error = ""

    def check(self) -> list[Mismatch]:
        """One comparison of every pod kubelet lists; returns the mismatches found."""
        try:
            with self.admission.calls_held():
                assigned = self.client.list()
                chosen = {u: s.allocations() for u, s in self.admission.served.items() if s.chosen}
            # kube-apiserver unreachable (restarting) is a pass skipped, as kubelet unreachable is
            pods = self.admission.list_pods()
        except (PodResourcesError, Refused) as exc:
            self.error = str(exc)
            log.warning("%s", self.error)
            return []
        self.error = ""
        inv = self.admission.inventory
        found: list[Mismatch] = []
        for pod in pods:
            if (pod.get("status") or {}).get("phase") in rn.TERMINAL_POD_PHASES:
                continue
            held = assigned.get(pod_key(pod))
            if not held:
                continue  # not admitted yet
            uid = str((pod.get("metadata") or {}).get("uid", ""))
            mine = chosen.get(uid)
            if mine is not None:  # judged by what the node chose, written or not
                pod = copy.deepcopy(pod)
                pod["metadata"]["annotations"] = {
                    **(pod["metadata"].get("annotations") or {}),
                    keys.DEVICE_ALLOCATED: mine.to_json(),
                    keys.ALLOCATED_NODE: self.admission.node_name,
                }
            found.extend(self._check_pod(pod, held, inv))
        self.mismatches = found
        return found

    def _check_pod(
        self, pod: dict[str, Any], held: dict[str, dict[str, list[str]]], inv: Inventory
    ) -> list[Mismatch]:
        found: list[Mismatch] = []
        truth: dict[str, list[str]] = {}
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        for resource in SERVED_RESOURCES:
            try:
                requests = container_requests(pod, resource)
            except ExpectationError:
                continue
            if not requests:
                continue
            # kubelet allocates a pod's containers one after another: one holding nothing yet is
            # still being admitted, not a mismatch
            kubelet = {name: ids for name, _ in requests if (ids := held.get(name, {}).get(resource))}
            if not kubelet:
                continue
            try:
                other = allocated_elsewhere(annotations, self.admission.node_name)
                if other:
                    raise ExpectationError(
                        f"its {keys.DEVICE_ALLOCATED} annotation was made for node {other}"
                    )
                exps = {e.container: e for e in expectations(pod, resource, inv)}
                bad = [
                    (n, "annotation differs")
                    for n, ids in kubelet.items()
                    if not exps[n].accepts(resource, ids)
                ]
            except ExpectationError as exc:
                bad = [(n, str(exc)) for n in kubelet]
            for name, reason in bad:
                found.append(Mismatch(pod_key(pod), resource, name, tuple(kubelet[name]), reason))
                MISMATCHES.labels(resource).inc()
            # the truth is rewritten once every container holds its IDs (a later pass, if not now)
            if bad and resource != rn.RDMA and len(kubelet) == len(requests):
                truth[resource] = [i for name, _ in requests for i in kubelet[name]]
        if found:
            message = "; ".join(
                f"{m.resource} container {m.container!r}: kubelet assigned {list(m.kubelet)} ({m.reason})"
                for m in found
            )
            log.warning("pod %s: %s", pod_key(pod), message)
            self.events.warn(pod, MISMATCH_REASON, message)
            if truth:
                self._correct(pod, truth, inv)
        return found

    def _correct(self, pod: dict[str, Any], truth: dict[str, list[str]], inv: Inventory) -> None:
        meta = pod.get("metadata") or {}
        text = (meta.get("annotations") or {}).get(keys.DEVICE_ALLOCATED)
        try:
            allocated = parse_device_allocated(text) if text else DeviceAllocations()
        except CodecError:
            allocated = DeviceAllocations()
        gpu = rn.DeviceType.GPU.value
        for resource, ids in truth.items():
            entries = _truth_entries(resource, ids, inv, allocated[gpu])
            if entries is None:
                log.warning(
                    "pod %s: kubelet holds %s IDs this agent does not serve; annotation kept",
                    pod_key(pod),
                    resource,
                )
                return
            allocated.by_type[gpu] = entries
        if self.patch_annotation is not None:
            self.patch_annotation(
                str(meta.get("namespace", "")), str(meta.get("name", "")), allocated.to_json()
            )
            self.corrected += 1


class CrossCheckLoop(threading.Thread):
    """Runs `check` every `interval` seconds and soon after each served Allocate (`poke`)."""

    def __init__(self, checker: CrossChecker, *, interval: float = 30.0, delay: float = 2.0) -> None:
        super().__init__(name="podresources-crosscheck", daemon=True)
        self.checker = checker
        self.interval = interval
        self.delay = delay
        self._poke = threading.Event()
        self._halt = threading.Event()

    def poke(self) -> None:
        self._poke.set()

    def run(self) -> None:
        while not self._halt.is_set():
            if self._poke.wait(self.interval):
                self._poke.clear()
                if self._halt.wait(self.delay):  # let kubelet finish admitting the burst
                    return
            try:
                self.checker.check()
            except Exception:  # a bad pass must not end the loop
                log.exception("PodResources cross-check failed")

    def stop(self) -> None:
        self._halt.set()
        self._poke.set()
        if self.is_alive():
            self.join(5.0)
