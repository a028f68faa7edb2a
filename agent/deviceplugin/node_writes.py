"""Writing into a pod's annotations the devices the node chose for it (on_node.py), with a Normal
Event saying so.

For every served pod the node chose devices for, the pod's `device-allocated` annotation becomes
what the node chose for its containers served so far (Koordinator's format; a multi-container pod's
containers are merged in as kubelet admits them), beside `topoalloc.io/allocated-node` naming this
node, so that the allocator counts the devices (it ignores an annotation made for another node).
The write is a merge patch with the pod's UID as precondition, retried with backoff until it lands
or the pod is gone (not found, another pod of that name, finished: the served state drops it). The
choice is in the served journal before Allocate answers, so an agent restarted before the write
makes it after its restart.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from agent.deviceplugin.events import NO_EVENTS, EventSink
from agent.deviceplugin.served import ServedPod
from agent.kube import TRANSPORT_ERRORS, another_pod, short_error, status_of
from apis import keys
from apis.annotations import DeviceAllocations

log = logging.getLogger(__name__)

CHOSEN_REASON = "DevicesChosenOnNode"
RETRY_FIRST = 0.5  # seconds before a failed write is tried again, doubling up to RETRY_MAX
RETRY_MAX = 30.0


def describe(allocated: DeviceAllocations) -> str:
    """The devices, as a person reads them."""
    parts = []
    for e in allocated["gpu"]:
        res = e.resources or {}
        core = res.get("koordinator.sh/gpu-core")
        share = "" if core is None or core.value() == 100 else f" {core.value()} %"
        parts.append(f"GPU {e.minor} ({e.id}){share}")
    for e in allocated["rdma"]:
        vfs = "".join(f" VF {vf.bus_id}" for vf in e.vfs)
        parts.append(f"RDMA {e.minor} ({e.id}{vfs})")
    return ", ".join(parts)


class NodeWrites(threading.Thread):
    """`served()`: a snapshot of the served pods; `pods()`: this node's pods (None when unknown);
    `patch(namespace, name, uid, annotations)` raises the transport errors of agent/kube.py."""

    def __init__(
        self,
        *,
        node: str,
        served: Callable[[], dict[str, ServedPod]],
        pods: Callable[[], list[dict[str, Any]] | None],
        patch: Callable[[str, str, str, dict[str, str]], None],
        events: EventSink = NO_EVENTS,
        batch: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(name="node-choice-writes", daemon=True)
        self.node = node
        self.served = served
        self.pods = pods
        self.patch = patch
        self.events = events
        self.batch = batch  # after a poke: the other containers of the pod being admitted join in
        self.clock = clock
        self.done: dict[str, str] = {}  # pod uid -> the device-allocated value it carries now
        self._retry: dict[str, tuple[float, float]] = {}  # pod uid -> (not before, backoff)
        self._poke = threading.Event()
        self._halt = threading.Event()
        self.written = 0
        self.error = ""

    def poke(self) -> None:
        self._poke.set()

    def pending(self) -> int:
        return len(self._retry)

    def write_pass(self) -> float | None:
        """One round over the served pods; returns when the next retry is due (None: none)."""
        served = {u: s for u, s in self.served().items() if s.chosen}
        for gone in set(self.done) - set(served):
            del self.done[gone]
        for gone in set(self._retry) - set(served):
            del self._retry[gone]
        todo = {u: (s, a.to_json()) for u, s in served.items() if (a := s.allocations()) is not None}
        todo = {u: t for u, t in todo.items() if self.done.get(u) != t[1]}
        pods = {str((p.get("metadata") or {}).get("uid", "")): p for p in (self.pods() or [])} if todo else {}
        now = self.clock()
        for uid, (s, want) in todo.items():
            pod = pods.get(uid)
            annotations: Mapping[str, Any] = ((pod or {}).get("metadata") or {}).get("annotations") or {}
            if (
                annotations.get(keys.DEVICE_ALLOCATED) == want
                and annotations.get(keys.ALLOCATED_NODE) == self.node
            ):
                self.done[uid] = want  # written before (this agent's earlier life)
                self._retry.pop(uid, None)
                continue
            if self._retry.get(uid, (0.0, 0.0))[0] > now:
                continue
            self._write(uid, s, want)
        due = [at for at, _ in self._retry.values()]
        return max(0.05, min(due) - self.clock()) if due else None

    def _write(self, uid: str, s: ServedPod, want: str) -> None:
        try:
            self.patch(
                s.namespace, s.name, uid, {keys.DEVICE_ALLOCATED: want, keys.ALLOCATED_NODE: self.node}
            )
        except TRANSPORT_ERRORS as exc:
            if status_of(exc) == 404 or another_pod(exc):  # deleted, or another pod of that name
                log.info("pod %s/%s is gone: its devices' annotation is not written", s.namespace, s.name)
                self.done[uid] = want
                self._retry.pop(uid, None)
                return
            backoff = min(RETRY_MAX, 2 * self._retry.get(uid, (0.0, RETRY_FIRST / 2))[1])
            self._retry[uid] = (self.clock() + backoff, backoff)
            self.error = f"pod {s.namespace}/{s.name}: {short_error(exc)}"
            log.warning(
                "annotation of the devices chosen for %s not written (again in %.1fs)", self.error, backoff
            )
            return
        self.done[uid] = want
        self._retry.pop(uid, None)
        self.written += 1
        self.error = ""
        allocated = s.allocations()
        chose = describe(allocated) if allocated is not None else ""
        pod = {"metadata": {"namespace": s.namespace, "name": s.name, "uid": uid}}
        message = f"No device allocation for node {self.node} ({s.why}): the node chose {chose}"
        self.events.note(pod, CHOSEN_REASON, message)
        log.info("pod %s/%s: devices chosen on the node written: %s", s.namespace, s.name, chose)

    def run(self) -> None:
        wait: float | None = None
        first = True  # a pass at once: what an earlier life of the agent chose and did not write
        while not self._halt.is_set():
            if not first and self._poke.wait(wait):
                self._poke.clear()
                if self._halt.wait(self.batch):
                    return
            first = False
            if self._halt.is_set():
                return
            try:
                wait = self.write_pass()
            except Exception:  # a bad pass must not end the loop
                log.exception("writing the devices chosen on the node failed")
                wait = RETRY_MAX

    def stop(self) -> None:
        self._halt.set()
        self._poke.set()
        if self.is_alive():
            self.join(5.0)
