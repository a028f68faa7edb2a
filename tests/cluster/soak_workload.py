"""The soak's workload: seeded, one action per tick, for as long as the soak runs. No pytest here.

Single pods of every shape on the device plugin nodes (whole GPUs, shared GPUs by `gpu-core`, GPUs
with their RDMA NIC under one PCIe switch), gangs of each source the release serves (scheduler-
plugins' PodGroup; Kubernetes' own PodGroup on 1.36, a Workload on 1.35), pods with DRA claims and
gangs of them on the DRA nodes, Reservations with owners and a ttl (an owner pod following some),
pods deleted and jobs finishing (a gang as a whole), under three priority classes so that
preemption happens. A create the API refuses (the gang webhook unreachable: it fails closed) is
retried a few ticks later, as a controller would.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import random
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.cluster.dra_claims import claim_pod
from tests.cluster.gang_sources import NATIVE, SCHEDULER_PLUGINS, WORKLOAD, GangSource
from tests.cluster.harness import ClusterEnv, gpu_pod
from tests.cluster.soak_world import NS, POOL, PRIORITIES, RESERVATIONS
from tests.soak.invariants import GangView
from tests.support.controlplane import ApiStatus

JSON = dict[str, Any]
RDMA = "koordinator.sh/rdma"
JOINT = "scheduling.koordinator.sh/device-joint-allocate"
SAME_PCIE = json.dumps({"deviceTypes": ["gpu", "rdma"], "requiredScope": "SamePCIe"})
RESERVATION_TTL = 30
OWNER = "topoalloc.soak/owner"
RETRIES = 4
RETRY_AFTER = 5.0
MAX_WAITING = 15


def gang_sources_of(minor: str) -> tuple[GangSource, ...]:
    """The gang sources the soak runs on a release (the native one without kube-scheduler's gang
    plugin needs kube-scheduler restarted: the tier's gang modules cover it)."""
    return tuple(s for s in (SCHEDULER_PLUGINS, NATIVE, WORKLOAD) if minor in s.releases)


@dataclass
class Workload:
    cluster: ClusterEnv
    rng: random.Random
    clock: Callable[[], float]
    gpu_capacity: int  # GPUs of the device plugin nodes: the workload keeps about this much asked
    sources: tuple[GangSource, ...]
    created: dict[str, float] = field(default_factory=dict)  # pod key -> when (soak clock)
    gangs: dict[str, GangView] = field(default_factory=dict)
    expiries: dict[str, float] = field(default_factory=dict)  # Reservation -> when its ttl ends
    counts: Counter[str] = field(default_factory=Counter)
    log: list[str] = field(default_factory=list)  # what it did, for the reproduction record
    removed: set[str] = field(default_factory=set)  # pod keys it deleted itself
    _retry: list[tuple[float, int, str, JSON]] = field(default_factory=list)  # (due, tries, kind, body)
    _names: itertools.count[int] = field(default_factory=itertools.count)
    _asked: dict[str, int] = field(default_factory=dict)  # pod key -> GPUs asked

    @property
    def cp(self) -> Any:
        return self.cluster.cp

    def run(self, stop: threading.Event, every: float = 1.5) -> None:
        while not stop.wait(self.rng.uniform(0.5, every * 1.5)):
            try:
                self.tick()
            except Exception as exc:  # kube-apiserver restarting: the next tick goes on
                self.counts["api errors"] += 1
                self.log.append(f"{self.clock():.1f} error {exc}"[:300])

    def tick(self) -> None:
        now = self.clock()
        for item in [r for r in self._retry if r[0] <= now]:
            self._retry.remove(item)
            self._create(item[2], item[3], tries=item[1])
        # past the plugin nodes' GPUs asked, or a backlog of waiting pods (claims count there), it
        # deletes and finishes more than it creates: pods wait, but the backlog does not grow forever
        waiting = sum(1 for p in self._live_pods() if not p["spec"].get("nodeName"))
        full = sum(self._asked.values()) >= self.gpu_capacity or waiting > MAX_WAITING
        actions: list[tuple[Callable[[], None], int]] = [
            (self.whole, 3),
            (self.shared, 2),
            (self.joint, 2),
            (self.gang, 2),
            (self.claim, 2),
            (self.claim_gang, 1),
            (self.reservation, 1),
            (self.delete, 5 if full else 1),
            (self.finish, 5 if full else 1),
        ]
        action = self.rng.choices([a for a, _ in actions], [w for _, w in actions])[0]
        action()

    # -- creating -----------------------------------------------------------------------------------

    def _name(self, kind: str) -> str:
        return f"{kind}-{next(self._names)}"

    def _priority(self, body: JSON) -> JSON:
        body["spec"]["priorityClassName"] = self.rng.choices(list(PRIORITIES), [5, 3, 1])[0]
        body["spec"]["terminationGracePeriodSeconds"] = 0
        return body

    def _create(self, kind: str, body: JSON, *, tries: int = 0, gpus: int = 0) -> None:
        path = f"/api/v1/namespaces/{NS}/pods"
        if body.get("kind") == "Reservation":
            path = RESERVATIONS
        try:
            self.cp.admin.post(path, body)
        except ApiStatus as exc:
            self.counts["creates refused"] += 1
            self.log.append(f"{self.clock():.1f} refused {kind} {body['metadata']['name']}: {exc}"[:300])
            if tries + 1 < RETRIES:
                self._retry.append((self.clock() + RETRY_AFTER, tries + 1, kind, body))
            return
        if body.get("kind") != "Reservation":
            key = f"{NS}/{body['metadata']['name']}"
            self.created[key] = self.clock()
            self._asked[key] = gpus or self._asked.get(key, 0)
        self.counts[kind] += 1
        self.log.append(f"{self.clock():.1f} create {kind} {body['metadata']['name']}")

    def _pod(self, kind: str, gpus: int = 0, **kw: Any) -> None:
        body = self._priority(gpu_pod(self._name(kind), gpus=gpus, node_selector=dict(POOL), **kw))
        self._create(f"pods {kind}", body, gpus=gpus or 1)

    def whole(self) -> None:
        self._pod("whole", gpus=self.rng.choice((1, 1, 2, 4, 8)))

    def shared(self) -> None:
        share = str(self.rng.choice((25, 50)))
        self._pod(
            "shared", resources={"koordinator.sh/gpu-core": share, "koordinator.sh/gpu-memory-ratio": share}
        )

    def joint(self) -> None:
        self._pod(
            "joint", gpus=self.rng.choice((1, 2)), resources={RDMA: "1"}, annotations={JOINT: SAME_PCIE}
        )

    def gang(self) -> None:
        source = self.rng.choice(self.sources)
        group, members, gpus = self._name("gang"), self.rng.choice((2, 3, 4)), self.rng.choice((1, 2, 4))
        try:
            source.create(self.cp, NS, group, members)
        except ApiStatus:
            self.counts["creates refused"] += 1
            return
        self.counts[f"gangs {source.id}"] += 1
        names = [f"{group}-{i}" for i in range(members)]
        self.gangs[f"{NS}/{group}"] = GangView(f"{NS}/{group}", members, tuple(f"{NS}/{n}" for n in names))
        priority = self.rng.choices(list(PRIORITIES), [5, 3, 1])[0]
        for name in names:
            body = source.join(gpu_pod(name, gpus=gpus, node_selector=dict(POOL)), group)
            body["spec"].update(priorityClassName=priority, terminationGracePeriodSeconds=0)
            self._create("gang members", body, gpus=gpus)

    def claim(self) -> None:
        body = claim_pod(self._name("claim"), self.rng.choice(("gpu1", "gpu2")), NS)
        body["spec"]["terminationGracePeriodSeconds"] = 0
        self._create("pods with claims", body, gpus=0)

    def claim_gang(self) -> None:
        group = self._name("claimgang")
        with contextlib.suppress(ApiStatus):
            SCHEDULER_PLUGINS.create(self.cp, NS, group, 2)
            names = [f"{group}-{i}" for i in range(2)]
            self.gangs[f"{NS}/{group}"] = GangView(f"{NS}/{group}", 2, tuple(f"{NS}/{n}" for n in names))
            self.counts["gangs of claims"] += 1
            for name in names:
                body = SCHEDULER_PLUGINS.join(claim_pod(name, "gpu2", NS), group)
                body["spec"]["terminationGracePeriodSeconds"] = 0
                self._create("pods with claims", body)

    def reservation(self) -> None:
        name, gpus = self._name("resv"), self.rng.choice((1, 2))
        requests = {"nvidia.com/gpu": str(gpus)}
        body = {
            "apiVersion": "scheduling.koordinator.sh/v1alpha1",
            "kind": "Reservation",
            "metadata": {"name": f"{NS}-{name}", "labels": {"topoalloc.soak/run": "1"}},
            "spec": {
                "template": {
                    "metadata": {"namespace": NS},
                    "spec": {
                        "nodeSelector": dict(POOL),
                        "containers": [
                            {"name": "main", "resources": {"requests": requests, "limits": requests}}
                        ],
                    },
                },
                "owners": [{"labelSelector": {"matchLabels": {OWNER: name}}}],
                "ttl": f"{RESERVATION_TTL}s",
                "allocateOnce": self.rng.random() < 0.5,
            },
        }
        self._create("reservations", body)
        self.expiries[f"{NS}-{name}"] = self.clock() + RESERVATION_TTL
        if self.rng.random() < 0.6:  # its owner comes a little later
            owner = self._priority(
                gpu_pod(f"{name}-owner", gpus=gpus, labels={OWNER: name}, node_selector=dict(POOL))
            )
            self._retry.append((self.clock() + self.rng.uniform(2, 10), 0, "reservation owners", owner))

    # -- ending -------------------------------------------------------------------------------------

    def _live_pods(self) -> list[JSON]:
        items = self.cp.admin.get(f"/api/v1/namespaces/{NS}/pods")["items"]
        return [p for p in items if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]

    def _whole_job(self, pod: JSON) -> list[str]:
        """The pod's name, or every member's of its gang."""
        key = f"{NS}/{pod['metadata']['name']}"
        gang = next((g for g in self.gangs.values() if key in g.members), None)
        return [m.split("/", 1)[1] for m in gang.members] if gang else [pod["metadata"]["name"]]

    def delete(self) -> None:
        pods = self._live_pods()
        live = {f"{NS}/{p['metadata']['name']}" for p in pods}
        for key in [k for k in self._asked if k not in live]:  # evicted, preempted meanwhile
            del self._asked[key]
        if not pods:
            return
        for name in self._whole_job(self.rng.choice(pods)):
            with contextlib.suppress(ApiStatus):
                self.removed.add(f"{NS}/{name}")
                self.cp.admin.delete(f"/api/v1/namespaces/{NS}/pods/{name}", gracePeriodSeconds=0)
                self.counts["deleted"] += 1
            self._asked.pop(f"{NS}/{name}", None)
        self._collect()

    def finish(self) -> None:
        bound = [p for p in self._live_pods() if p["spec"].get("nodeName")]
        if not bound:
            return
        for name in self._whole_job(self.rng.choice(bound)):
            with contextlib.suppress(ApiStatus):
                path = f"/api/v1/namespaces/{NS}/pods/{name}/status"
                self.cp.admin.merge_patch(path, {"status": {"phase": "Succeeded"}})
                self.counts["finished"] += 1
            self._asked.pop(f"{NS}/{name}", None)

    def _collect(self) -> None:
        """Finished pods deleted (what a Job's cleanup or the pod GC does)."""
        for pod in self.cp.admin.get(f"/api/v1/namespaces/{NS}/pods")["items"]:
            if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                self.removed.add(f"{NS}/{pod['metadata']['name']}")
                with contextlib.suppress(ApiStatus):
                    self.cp.admin.delete(
                        f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}", gracePeriodSeconds=0
                    )
