"""For the defragmentation scenarios on the real control plane (no kubelet runs there): kubelet's
part for one namespace's pods, and two witnesses that record every version of what they watch.

`ReadyKubelet` reports a pod Running and Ready `delay` seconds after it is bound (as a real kubelet
takes to pull and start it), with a `startTime` `age[node]` seconds in the past, and lets a pod
being deleted (evicted) go at once, its name in `evicted`.

`MoveWatch` records every version of the Reservations made for the namespace's pods and of its
pods, and replays them in the cluster's order (the resourceVersion: one etcd serves both) to count
the moves in flight at every moment: a move is in flight from its Reservation's creation until the
pod that took its room (`currentOwners`) is bound on the room's node and Ready, or the room failed
or was closed.

`Availability` records every version of a Deployment's status from a given resourceVersion on: the
fewest `availableReplicas` it ever reported.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

from tests.support.controlplane import ApiStatus, ControlPlane

JSON = dict[str, Any]
RESERVATIONS = "/apis/scheduling.koordinator.sh/v1alpha1/reservations"
DEFRAG_POD = "topoalloc.io/defrag-pod"


def ready(pod: JSON) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


class ReadyKubelet:
    def __init__(self, cp: ControlPlane, namespace: str, *, delay: float = 0.0) -> None:
        self.cp = cp
        self.namespace = namespace
        self.delay = delay
        self.age: dict[str, float] = {}  # node -> how old its pods' startTime says they are
        self.evicted: set[str] = set()
        self.ready_at: dict[str, float] = {}  # pod name -> when it was reported Ready (monotonic)
        self._started: set[str] = set()  # pod uids being started
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._timers: list[threading.Timer] = []
        cp.watch_pods(namespace, self._event, self._stop, f"kubelet-{namespace}")

    def _event(self, event: JSON) -> None:
        if event.get("type") not in ("ADDED", "MODIFIED"):
            return
        pod = event.get("object") or {}
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        name, uid, node = meta.get("name", ""), meta.get("uid", ""), spec.get("nodeName")
        if meta.get("deletionTimestamp"):
            with self._lock:
                self.evicted.add(name)
            with contextlib.suppress(ApiStatus):
                self.cp.admin.delete(f"/api/v1/namespaces/{self.namespace}/pods/{name}", gracePeriodSeconds=0)
            return
        if not node or ready(pod):
            return
        with self._lock:
            if uid in self._started or self._stop.is_set():
                return
            self._started.add(uid)
            timer = threading.Timer(self.delay, self._run, (name, uid, node))
            timer.daemon = True
            self._timers.append(timer)
        timer.start()

    def _run(self, name: str, uid: str, node: str) -> None:
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - self.age.get(node, 0.0)))
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        status = {
            "phase": "Running",
            "startTime": started,
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}],
        }
        path = f"/api/v1/namespaces/{self.namespace}/pods/{name}/status"
        with contextlib.suppress(ApiStatus):
            # uid precondition: never a re-created pod of the name
            self.cp.admin.merge_patch(path, {"metadata": {"uid": uid}, "status": status})
            with self._lock:
                self.ready_at[name] = time.monotonic()

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            for timer in self._timers:
                timer.cancel()


class _Recorder:
    """Every watch event of some collections, with its resourceVersion."""

    def __init__(self) -> None:
        self.events: list[tuple[int, str, str, JSON]] = []  # (resourceVersion, stream, type, object)
        self._lock = threading.Lock()
        self.stop = threading.Event()

    def on(self, stream: str) -> Any:
        def record(event: JSON) -> None:
            obj = event.get("object") or {}
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            if event.get("type") in ("ADDED", "MODIFIED", "DELETED") and rv:
                with self._lock:
                    self.events.append((int(rv), stream, str(event["type"]), obj))

        return record

    def in_order(self) -> list[tuple[int, str, str, JSON]]:
        with self._lock:
            return sorted(self.events, key=lambda e: e[0])


class MoveWatch(_Recorder):
    def __init__(self, cp: ControlPlane, namespace: str) -> None:
        super().__init__()
        self.namespace = namespace
        cp.watch(RESERVATIONS, self.on("rooms"), self.stop, f"rooms-{namespace}")
        cp.watch_pods(namespace, self.on("pods"), self.stop, f"pods-{namespace}")

    def _ours(self, room: JSON) -> bool:
        notes = (room.get("metadata") or {}).get("annotations") or {}
        return str(notes.get(DEFRAG_POD, "")).startswith(self.namespace + "/")

    def in_flight(self) -> list[tuple[int, int]]:
        """(resourceVersion, moves in flight) after every recorded event, in the cluster's order."""
        rooms: dict[str, JSON] = {}
        pods: dict[str, JSON] = {}
        out = []
        for rv, stream, kind, obj in self.in_order():
            store, key = (
                (rooms, obj["metadata"]["name"]) if stream == "rooms" else (pods, obj["metadata"]["name"])
            )
            if kind == "DELETED":
                store.pop(key, None)
            elif stream == "pods" or self._ours(obj):
                store[key] = obj
            out.append((rv, sum(1 for room in rooms.values() if not self._done(room, pods))))
        return out

    def most(self) -> int:
        return max((n for _, n in self.in_flight()), default=0)

    def made(self) -> int:
        """Reservations made for the namespace's pods so far."""
        return len(
            {o["metadata"]["name"] for _, s, _, o in self.in_order() if s == "rooms" and self._ours(o)}
        )

    @staticmethod
    def _done(room: JSON, pods: dict[str, JSON]) -> bool:
        status = room.get("status") or {}
        if status.get("phase") == "Failed" or room["metadata"].get("annotations", {}).get(
            "topoalloc.io/defrag-closed"
        ):
            return True
        for owner in status.get("currentOwners") or []:
            pod = pods.get(owner.get("name", ""))
            if (
                pod is not None
                and pod["metadata"].get("uid") == owner.get("uid")
                and pod["spec"].get("nodeName") == status.get("nodeName")
                and ready(pod)
            ):
                return True
        return False


class Availability(_Recorder):
    def __init__(self, cp: ControlPlane, namespace: str, name: str, resource_version: str) -> None:
        super().__init__()
        self.name = name
        path = f"/apis/apps/v1/namespaces/{namespace}/deployments"
        cp.watch(
            path,
            self.on("deployment"),
            self.stop,
            f"availability-{namespace}",
            resource_version=resource_version,
        )

    def reported(self) -> list[int]:
        """availableReplicas of every version since the start."""
        return [
            int((o.get("status") or {}).get("availableReplicas") or 0)
            for _, _, kind, o in self.in_order()
            if kind != "DELETED" and o["metadata"]["name"] == self.name
        ]


def close(*parts: ReadyKubelet | _Recorder | None) -> None:
    for part in parts:
        if isinstance(part, ReadyKubelet):
            part.close()
        elif part is not None:
            part.stop.set()
