"""The soak's faults: a seeded schedule and the thread that injects each at its time. No pytest.

Kinds: an agent SIGKILLed (started again on the same folders a few seconds later: kubelet's plugin
registration, the DRA registry and the agent's checkpoint do the rest), the leader allocator and the
follower SIGKILLed (started again), kube-apiserver restarted, etcd compacted (every watch resumes
into 410 Gone), the webhook unreachable for a while (its Service with no endpoint: the gang webhook
fails closed), and a GPU turning unhealthy (an Xid through the agent's fixture events; healthy again
`XID_HOLD` seconds later). The schedule cycles through every kind in a seeded order, so a short soak
still sees each one.
"""

from __future__ import annotations

import random
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from agent.fixtures.event_inbox import write_event
from tests.cluster.dra import restart_agent
from tests.cluster.soak_world import IDENTITIES, XID_HOLD, SoakWorld
from tests.support.cluster_product import lease_holder
from tests.support.controlplane import Process, wait_until

KINDS = (
    "agent-kill",
    "leader-kill",
    "follower-kill",
    "apiserver-restart",
    "etcd-compaction",
    "webhook-down",
    "gpu-unhealthy",
)
WEBHOOK_DOWN = 10.0
RESTART_AFTER = 3.0


@dataclass
class Fault:
    at: float  # planned, soak clock
    kind: str
    target: str = ""
    started: float | None = None
    ended: float | None = None
    error: str = ""


def schedule(
    rng: random.Random, duration: float, every: float, start: float = 20.0, tail: float = 40.0
) -> list[Fault]:
    """Faults about every `every` seconds between `start` and `duration - tail` (a quiet end, so
    that what a late fault disturbed has its grace), each kind once per cycle in a seeded order."""
    span = max(duration - tail - start, 1.0)
    count = max(1, int(span // every))
    kinds: list[str] = []
    while len(kinds) < count:
        cycle = list(KINDS)
        rng.shuffle(cycle)
        kinds += cycle
    gap = span / count
    times = sorted(start + i * gap + rng.uniform(0, gap * 0.6) for i in range(count))
    return [Fault(t, k) for t, k in zip(times, kinds[:count], strict=True)]


@dataclass
class Injector:
    world: SoakWorld
    rng: random.Random
    faults: list[Fault]
    last: float = float("-inf")  # when the last fault's effect ended (or began, while it lasts)
    counts: Counter[str] = field(default_factory=Counter)
    _generation: int = 0

    def run(self, stop: threading.Event) -> None:
        for fault in self.faults:
            if stop.wait(max(0.0, fault.at - self.world.clock())):
                return
            fault.started = self.last = self.world.clock()
            lasts = 0.0
            try:
                lasts = self.inject(fault)
            except Exception as exc:  # a fault that failed to inject is recorded, the soak goes on
                fault.error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"[:2000]
            fault.ended = self.last = self.world.clock() + lasts
            self.counts[fault.kind] += 1

    def inject(self, fault: Fault) -> float:
        """Inject the fault; returns for how many seconds more its effect lasts by itself."""
        handler: Callable[[Fault], float | None] = getattr(self, "_" + fault.kind.replace("-", "_"))
        return handler(fault) or 0.0

    def records(self) -> list[dict[str, Any]]:
        return [asdict(f) for f in self.faults]

    # -- the kinds ----------------------------------------------------------------------------------

    def _agent_kill(self, fault: Fault) -> None:
        nodes: list[Any] = [*self.world.plugin_nodes, *self.world.dra_nodes]
        node = self.rng.choice(nodes)
        fault.target = node.name
        self._generation += 1
        node.agent.kill()
        time.sleep(RESTART_AFTER)
        if node in self.world.dra_nodes:
            restart_agent(self.world.cluster, node, self._generation)
        else:
            old: Process = node.agent
            node.agent = Process(old.name, old.argv, old.log).start()
            self.world.cluster.extra.append(node.agent)

    def _leader(self) -> str:
        cluster = self.world.cluster
        return wait_until(
            lambda: (
                (h := lease_holder(cluster.cp)) in cluster.replicas
                and cluster.replicas[h].process.alive()
                and h
            ),
            timeout=60,
            what="a live leader",
        )

    def _kill_replica(self, fault: Fault, identity: str) -> None:
        fault.target = identity
        self.world.cluster.replicas[identity].process.kill()
        time.sleep(RESTART_AFTER)
        self.world.start_allocator(identity)
        self.world.cluster.replicas[identity].wait_ready()

    def _leader_kill(self, fault: Fault) -> None:
        self._kill_replica(fault, self._leader())

    def _follower_kill(self, fault: Fault) -> None:
        leader = self._leader()
        self._kill_replica(fault, next(i for i in IDENTITIES if i != leader))

    def _apiserver_restart(self, fault: Fault) -> None:
        fault.target = "kube-apiserver"
        self.world.cluster.cp.restart_apiserver()

    def _etcd_compaction(self, fault: Fault) -> None:
        fault.target = f"revision {self.world.cluster.cp.compact_etcd()}"

    def _webhook_down(self, fault: Fault) -> None:
        cluster = self.world.cluster
        fault.target = f"{WEBHOOK_DOWN:.0f}s"
        saved = (cluster.webhook.target, cluster.leader_webhook.target)
        cluster.webhook.target = cluster.leader_webhook.target = lambda: None
        try:
            time.sleep(WEBHOOK_DOWN)
        finally:
            cluster.webhook.target, cluster.leader_webhook.target = saved

    def _gpu_unhealthy(self, fault: Fault) -> float:
        node = self.rng.choice(self.world.plugin_nodes)
        minor = self.rng.randrange(8)
        fault.target = f"{node.name} GPU {minor} for {XID_HOLD}s"
        write_event(self.world.inboxes[node.name], f"soak-{time.time_ns()}", [{"gpu": minor, "xid": 79}])
        return XID_HOLD
