"""A timed mixed workload with priorities and gangs: what gang preemption buys and what it costs.

The workload (seeded, so runs repeat exactly):

* the cluster: `racks` racks of 4 DGX H100 nodes (8 GPUs each, one NVSwitch domain per node),
  nodes labelled with their rack;
* low-priority batch pods (priority 0): 1, 2 or 4 whole GPUs (weights 6:3:1), arriving as a
  Poisson stream sized to keep the cluster about `load` busy, running an exponential time
  (mean `batch_hours`);
* high-priority training gangs (priority 1000): 2 to 4 members of 8 GPUs each, one every
  `gang_every_hours` on average, running `gang_hours` (exponential mean).

Every event (an arrival or a completion) places what waits: gangs first, by priority then age,
through the core's all-or-nothing planner (`plan_gang`, rack as the topology key), then batch pods
oldest first on the fullest node their devices fit (`allocate`). With `preempt=True` a gang that
fits nowhere gets the core's cluster-wide victim plan (`plan_with_preemption`: the cheapest
lower-priority pods that make room for all members at once); victims are evicted at once and go
back to the queue to start over, so the GPU-hours they had run are lost. Reported: gang wait (from
arrival to placement; a gang still waiting at the end counts with its wait so far) p50/p99 in
hours, GPU-hours lost to preemption, batch wait p50, GPU use.
"""

from __future__ import annotations

import heapq
import itertools
import random
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from allocator.core.cluster.state import ClusterState
from allocator.core.devices.allocate import Allocation, allocate
from allocator.core.gang.plan import GangPlan, GangPlanSettings, plan_gang
from allocator.core.gang.preemption import PreemptionPlan, plan_with_preemption
from allocator.core.gang.priority import by_priority
from allocator.core.gang.victims import Budget, Candidate
from allocator.core.node.gpu_summary import GPUSummary
from allocator.core.request.parse import pod_request
from allocator.core.request.pod_request import PodRequest
from simulator.nodes import fixture_objects

RACK = "topoalloc.io/rack"
HIGH, LOW = 1000, 0


@dataclass(frozen=True)
class MixSettings:
    racks: int = 4
    load: float = 0.85  # batch GPU demand as a share of the cluster
    batch_hours: float = 2.0
    gang_every_hours: float = 3.0
    gang_hours: float = 4.0
    days: float = 7.0
    seed: int = 1


@dataclass
class Job:
    name: str
    gpus: int  # per member
    members: int  # 1 for a batch pod
    hours: float
    priority: int
    arrived: float
    started: float = -1.0
    placed: dict[str, str] = field(default_factory=dict)  # pod key -> node


@dataclass(frozen=True)
class MixResult:
    preempt: bool
    gangs: int
    gangs_placed: int
    gang_wait_p50: float
    gang_wait_p99: float
    gpu_hours_lost: float
    preemptions: int
    victims: int
    batch_wait_p50: float
    gpu_use: float  # share of GPU-hours busy


def _pod(name: str, gpus: int, priority: int) -> PodRequest:
    res = {"nvidia.com/gpu": str(gpus)}
    raw = {
        "metadata": {"name": name, "namespace": "mix"},
        "spec": {
            "priority": priority,
            "containers": [{"name": "c", "resources": {"requests": res, "limits": res}}],
        },
    }
    return pod_request(raw)


def batch_arrivals(
    rng: random.Random, load: float, gpus_total: int, mean_hours: float, horizon: float
) -> Iterator[tuple[float, int, float]]:
    """(arrival, GPUs, hours) of batch pods of 1, 2 or 4 whole GPUs (weights 6:3:1): a Poisson
    stream sized to keep `load` of the GPUs busy, each running an exponential time."""
    sizes, weights = (1, 2, 4), (6, 3, 1)
    mean_gpus = sum(a * b for a, b in zip(sizes, weights, strict=True)) / sum(weights)
    rate = load * gpus_total / (mean_gpus * mean_hours)  # pods per hour
    t = 0.0
    while (t := t + rng.expovariate(rate)) < horizon:
        yield t, rng.choices(sizes, weights)[0], rng.expovariate(1 / mean_hours)


def _workload(s: MixSettings, gpus_total: int) -> list[Job]:
    rng = random.Random(s.seed)
    horizon = s.days * 24
    jobs: list[Job] = []
    for i, (t, g, hours) in enumerate(batch_arrivals(rng, s.load, gpus_total, s.batch_hours, horizon)):
        jobs.append(Job(f"b{i}", g, 1, hours, LOW, t))
    t, i = 0.0, 0
    while (t := t + rng.expovariate(1 / s.gang_every_hours)) < horizon:
        jobs.append(Job(f"g{i}", 8, rng.randint(2, 4), rng.expovariate(1 / s.gang_hours), HIGH, t))
        i += 1
    return sorted(jobs, key=lambda j: j.arrived)


class _Sim:
    def __init__(self, s: MixSettings, preempt: bool) -> None:
        self.s, self.preempt = s, preempt
        self.cluster = ClusterState()
        for r in range(s.racks):
            for n in range(4):
                node, device = fixture_objects("dgx-h100", f"r{r}n{n}")
                node["metadata"].setdefault("labels", {})[RACK] = f"r{r}"
                self.cluster.upsert_node(node)
                assert device is not None
                self.cluster.set_device(device)
        self.gpus = 8 * 4 * s.racks
        self.settings = GangPlanSettings(topology_keys=(RACK,))
        self.events: list[tuple[float, int, str, Job]] = []
        self.seq = itertools.count()
        self.waiting: list[Job] = []
        self.running: dict[str, Job] = {}  # job name -> job
        self.pods: dict[str, Job] = {}  # pod key -> job
        self.requests: dict[str, list[PodRequest]] = {}  # job name -> its pods, parsed once
        self.lost = 0.0
        self.preemptions = self.victims = 0
        self.busy = 0.0  # GPU-hours run to completion or lost
        self.gang_waits: list[float] = []
        self.batch_waits: list[float] = []

    def run(self, jobs: list[Job], progress: Callable[[float], None] = lambda _: None) -> MixResult:
        for job in jobs:
            heapq.heappush(self.events, (job.arrived, next(self.seq), "arrive", job))
        horizon = self.s.days * 24
        while self.events:
            now, _, kind, job = heapq.heappop(self.events)
            if now > horizon:
                break
            if kind == "arrive":
                self.waiting.append(job)
            elif job.name in self.running and job.started + job.hours <= now + 1e-9:
                self._stop(job, now, finished=True)
            self._schedule(now)
            progress(now / horizon)
        gangs = [j for j in jobs if j.members > 1 and j.arrived <= horizon]
        # A gang still waiting at the end counts with the wait so far (a lower bound).
        unplaced = [horizon - j.arrived for j in gangs if j in self.waiting]
        waits = sorted(self.gang_waits + unplaced)
        return MixResult(
            self.preempt,
            len(gangs),
            len(self.gang_waits),
            percentile(waits, 50),
            percentile(waits, 99),
            self.lost,
            self.preemptions,
            self.victims,
            percentile(sorted(self.batch_waits), 50),
            self.busy / (self.gpus * horizon),
        )

    def _schedule(self, now: float) -> None:
        queue = by_priority(self.waiting, lambda j: j.priority, lambda j: j.arrived, lambda j: j.name)
        for job in queue:
            if job.members > 1:
                self._try_gang(job, now)
            else:
                self._try_pod(job, now)

    def _requests(self, job: Job) -> list[PodRequest]:
        """The job's pods, parsed on its first try: a waiting job is tried again at every event."""
        found = self.requests.get(job.name)
        if found is None:
            found = [_pod(f"{job.name}-{i}", job.gpus, job.priority) for i in range(job.members)]
            self.requests[job.name] = found
        return found

    def _try_gang(self, job: Job, now: float) -> None:
        members = self._requests(job)
        found = plan_gang(self.cluster, members, self.settings)
        if not isinstance(found, GangPlan) and self.preempt:
            candidates = [
                Candidate(
                    key,
                    node,
                    self.pods[key].priority,
                    self.pods[key].name if self.pods[key].members > 1 else "",
                )
                for key, node in self.cluster.pod_node.items()
            ]
            pre = plan_with_preemption(
                self.cluster, members, candidates, self.settings, budget=Budget(subsets=2_000, checks=32)
            )
            if isinstance(pre, PreemptionPlan) and pre.victims:
                self.preemptions += 1
                self.victims += len(pre.victims)
                # In the victims' order: a set's order follows the hash seed, and so would the sums.
                for name in dict.fromkeys(self.pods[v.key].name for v in pre.victims):
                    victim = self.running[name]
                    self._stop(victim, now, finished=False)
                    self.waiting.append(victim)
                found = pre.plan
        if isinstance(found, GangPlan):
            for p in found.placements:
                self.cluster.assign(p.key, p.node, p.allocation.devices)
            self._start(job, now, {p.key: p.node for p in found.placements})
            self.gang_waits.append(now - job.arrived)

    def _try_pod(self, job: Job, now: float) -> None:
        (req,) = self._requests(job)
        passed, _ = self.cluster.feasible(req)
        best: tuple[int, str, Allocation] | None = None
        for name in passed:
            state = self.cluster.nodes[name]
            got = allocate(state, req)
            free = GPUSummary.of(state).whole_free
            if isinstance(got, Allocation) and (best is None or free < best[0]):
                best = (free, name, got)
        if best is None:
            return
        _, node, got = best
        self.cluster.assign(req.key, node, got.devices)
        self._start(job, now, {req.key: node})
        self.batch_waits.append(now - job.arrived)

    def _start(self, job: Job, now: float, placed: dict[str, str]) -> None:
        self.waiting.remove(job)
        job.started, job.placed = now, placed
        self.running[job.name] = job
        for key in placed:
            self.pods[key] = job
        heapq.heappush(self.events, (now + job.hours, next(self.seq), "finish", job))

    def _stop(self, job: Job, now: float, *, finished: bool) -> None:
        ran = (now - job.started) * job.gpus * job.members
        self.busy += ran
        if not finished:
            self.lost += ran
        for key in job.placed:
            self.cluster.unassign(key)
            self.pods.pop(key, None)
        del self.running[job.name]
        job.started, job.placed = -1.0, {}


def percentile(values: list[float], q: int) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def run_mix(
    settings: MixSettings, *, preempt: bool, progress: Callable[[float], None] = lambda _: None
) -> MixResult:
    sim = _Sim(settings, preempt)
    return sim.run(_workload(settings, sim.gpus), progress)
