"""What keeping gangs and RL job groups inside one leaf costs in wait, and saves in spread.

The cluster: `spines` spines of `leafs` leaf switches of `nodes` DGX H100 nodes each (8 GPUs, one
NVSwitch domain per node), labelled as NVIDIA Topograph labels them (`fabric.topograph.run/tier-0`
the leaf, `tier-1` the spine; the `topograph` profile). The workload (seeded, so runs repeat):

* batch pods of 1, 2 or 4 whole GPUs (weights 6:3:1), a Poisson stream sized to keep `load` of
  the GPUs busy, running an exponential time (mean `batch_hours`), placed on the fullest node
  they fit (what the scorer's bin packing does);
* training gangs (one every `gang_every_hours`): 2, 4 or 8 members of 4 GPUs, or 4 or 8 members
  of 2 GPUs, running `gang_hours` (exponential mean), placed all at once by the core's planner;
* RL job groups (one every `group_every_hours`): a master of 1 GPU and 3 to 6 workers of 2 GPUs,
  label `rl-job-group`, placed one pod at a time as the extender does: the nodes ranked by the
  sibling-affinity tiers over the profile's levels (a sibling's node, then its leaf, then its
  spine), then fullest first; running `group_hours`.

Each policy replays the same workload; only the gangs' and groups' wish changes:

* `none`: the core's planner without levels (`plan_gang`, the profile's keys as its topology
  preference: fewest nodes first, one domain only among plans of as few nodes);
* `preferred`: `kueue.x-k8s.io/podset-preferred-topology: <leaf>` (`plan_in_levels`);
* `required`: `...-required-topology: <leaf>`: a gang waits for one leaf to hold it; a job group's
  pods keep to the leaf of its first placed pods (`keep_to_level`).

Reported per policy: for gangs and for job groups, leafs and spines spanned per group (its pods'
nodes' domains; "racks spanned"), the share kept inside one leaf, and wait p50/p99 in hours (from
arrival until its last pod is placed; a group still waiting at the end counts with its wait so far).
"""

from __future__ import annotations

import heapq
import itertools
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from allocator.core.cluster.state import ClusterState, resources_fit
from allocator.core.devices.allocate import Allocation, allocate
from allocator.core.gang.levels import Levels, keep_to_level, levels_of, plan_in_levels
from allocator.core.gang.plan import GangPlan, GangPlanSettings
from allocator.core.gang.siblings import sibling_affinity
from allocator.core.node.gpu_summary import GPUSummary
from allocator.core.request.parse import pod_request
from allocator.core.request.pod_request import PodRequest
from apis.topology_constraint import TopologyWish
from apis.topology_profile import GENERIC, PRESETS
from simulator.nodes import fixture_objects
from simulator.priority_mix import batch_arrivals, percentile

PROFILE = PRESETS["topograph"]
LEAF, SPINE = PROFILE.key_of("leaf"), PROFILE.key_of("spine")
# `no-profile`: what the allocator did before topology profiles, on a Topograph cluster: its
# default topology keys (clique, topoalloc.io/rack, zone) are labels these nodes do not carry.
POLICIES = ("no-profile", "none", "preferred", "required")
LABELS = {
    "no-profile": "no levels",
    "none": "profile only",
    "preferred": "preferred leaf",
    "required": "required leaf",
}
GANG_SHAPES = ((2, 4), (4, 4), (8, 4), (4, 2), (8, 2))  # (members, GPUs each)


@dataclass(frozen=True)
class TopologyMixSettings:
    spines: int = 2
    leafs: int = 8  # per spine
    nodes: int = 4  # per leaf: a rack of DGX H100 (about 10 kW each) with its top-of-rack switch
    load: float = 0.55  # batch GPU demand as a share of the cluster
    batch_hours: float = 2.0
    gang_every_hours: float = 1.0
    gang_hours: float = 4.0
    group_every_hours: float = 2.0
    group_hours: float = 4.0
    days: float = 7.0
    seed: int = 1


@dataclass
class Job:
    name: str
    kind: str  # "batch", "gang" or "group"
    gpus: tuple[int, ...]  # per pod
    hours: float
    arrived: float
    placed: dict[str, str] = field(default_factory=dict)  # pod key -> node
    started: float = -1.0


@dataclass(frozen=True)
class Spread:
    count: int  # groups placed
    waiting: int  # still waiting at the end
    leafs: float  # mean leafs spanned
    spines: float
    one_leaf: float  # share inside one leaf
    wait_p50: float
    wait_p99: float


@dataclass(frozen=True)
class TopologyMixResult:
    policy: str
    gangs: Spread
    groups: Spread
    gpu_use: float


def _pod(name: str, gpus: int, labels: dict[str, str] | None = None) -> PodRequest:
    res = {"nvidia.com/gpu": str(gpus), "cpu": "4", "memory": "16Gi"}
    meta = {"name": name, "namespace": "mix", "labels": labels or {}}
    return pod_request(
        {"metadata": meta, "spec": {"containers": [{"name": "c", "resources": {"requests": res}}]}}
    )


def workload(s: TopologyMixSettings, gpus_total: int) -> list[Job]:
    rng = random.Random(s.seed)
    horizon = s.days * 24
    arrivals = batch_arrivals(rng, s.load, gpus_total, s.batch_hours, horizon)
    jobs = [Job(f"b{i}", "batch", (g,), hours, t) for i, (t, g, hours) in enumerate(arrivals)]
    t = 0.0
    for i in itertools.count():
        if (t := t + rng.expovariate(1 / s.gang_every_hours)) >= horizon:
            break
        members, each = rng.choice(GANG_SHAPES)
        jobs.append(Job(f"g{i}", "gang", (each,) * members, rng.expovariate(1 / s.gang_hours), t))
    t = 0.0
    for i in itertools.count():
        if (t := t + rng.expovariate(1 / s.group_every_hours)) >= horizon:
            break
        pods = (1,) + (2,) * rng.randint(3, 6)
        jobs.append(Job(f"j{i}", "group", pods, rng.expovariate(1 / s.group_hours), t))
    return sorted(jobs, key=lambda j: (j.arrived, j.name))


class _Sim:
    def __init__(self, s: TopologyMixSettings, policy: str) -> None:
        self.s, self.policy = s, policy
        self.cluster = ClusterState()
        for sp, lf, n in itertools.product(range(s.spines), range(s.leafs), range(s.nodes)):
            node, device = fixture_objects("dgx-h100", f"s{sp}l{lf}n{n}")
            node["metadata"].setdefault("labels", {}).update({LEAF: f"s{sp}l{lf}", SPINE: f"s{sp}"})
            self.cluster.upsert_node(node)
            assert device is not None
            self.cluster.set_device(device)
        self.gpus = 8 * s.spines * s.leafs * s.nodes
        self.keys = GENERIC.keys if policy == "no-profile" else PROFILE.keys
        self.settings = GangPlanSettings(topology_keys=self.keys)
        wish = {"preferred": TopologyWish(preferred="leaf"), "required": TopologyWish(required="leaf")}
        self.levels: Levels | None = levels_of(PROFILE, wish.get(policy))
        self.events: list[tuple[float, int, str, Job]] = []
        self.seq = itertools.count()
        self.waiting: list[Job] = []
        self.requests: dict[str, list[PodRequest]] = {}
        self.busy = 0.0
        self.waits: dict[str, list[float]] = {"gang": [], "group": []}
        # Room only grows when something finishes: a job that found none is tried again only then
        # (the allocator's gang lifecycle does the same with the watch's generation).
        self.finished = 0
        self.tried: dict[str, int] = {}
        self.spans: dict[str, list[tuple[int, int]]] = {"gang": [], "group": []}

    def run(self, jobs: list[Job], progress: Callable[[float], None]) -> TopologyMixResult:
        for job in jobs:
            heapq.heappush(self.events, (job.arrived, next(self.seq), "arrive", job))
        horizon = self.s.days * 24
        while self.events:
            now, _, kind, job = heapq.heappop(self.events)
            if now > horizon:
                break
            if kind == "arrive":
                self.waiting.append(job)
            else:
                self._finish(job, now)
                self.finished += 1
            self._schedule(now)
            progress(now / horizon)
        left = {k: [horizon - j.arrived for j in self.waiting if j.kind == k] for k in ("gang", "group")}
        return TopologyMixResult(
            self.policy, self._spread("gang", left["gang"]), self._spread("group", left["group"]), self.busy
        )

    def _spread(self, kind: str, left: list[float]) -> Spread:
        spans = self.spans[kind]
        waits = sorted(self.waits[kind] + left)
        mean = statistics.fmean
        return Spread(
            len(spans),
            len(left),
            mean(leafs for leafs, _ in spans) if spans else float("nan"),
            mean(spines for _, spines in spans) if spans else float("nan"),
            sum(1 for leafs, _ in spans if leafs == 1) / len(spans) if spans else float("nan"),
            percentile(waits, 50),
            percentile(waits, 99),
        )

    def _schedule(self, now: float) -> None:
        for job in list(self.waiting):  # oldest first; each one placed when it fits (backfill)
            if self.tried.get(job.name) == self.finished:
                continue
            self.tried[job.name] = self.finished
            if job.kind == "gang":
                self._try_gang(job, now)
            else:
                self._try_pods(job, now)

    def _requests(self, job: Job) -> list[PodRequest]:
        found = self.requests.get(job.name)
        if found is None:
            labels = {"rl-job-group": job.name} if job.kind == "group" else {}
            found = [_pod(f"{job.name}-{i}", g, labels) for i, g in enumerate(job.gpus)]
            self.requests[job.name] = found
        return found

    def _try_gang(self, job: Job, now: float) -> None:
        found = plan_in_levels(self.cluster, self._requests(job), self.settings, self.levels)
        if isinstance(found, GangPlan):
            for p in found.placements:
                self.cluster.assign(p.key, p.node, p.allocation.devices)
                job.placed[p.key] = p.node
            self._started(job, now)

    def _try_pods(self, job: Job, now: float) -> None:
        """Pods placed one at a time (batch pods, and job groups as the extender places them)."""
        for req in self._requests(job):
            if req.key in job.placed:
                continue
            got = self._best_node(job, req)
            if got is None:
                return  # its group's pods go in order: the next one waits too
            node, allocation = got
            self.cluster.assign(req.key, node, allocation.devices)
            job.placed[req.key] = node
        self._started(job, now)

    def _best_node(self, job: Job, req: PodRequest) -> tuple[str, Allocation] | None:
        names, _ = self.cluster.feasible(req)
        names = [n for n in names if resources_fit(self.cluster.nodes[n], req) is None]
        siblings: dict[str, int] = {}
        for node in job.placed.values():
            siblings[node] = siblings.get(node, 0) + 1
        if job.kind == "group" and self.levels is not None and self.levels.required:
            names, _ = keep_to_level(self.cluster.nodes, names, siblings, self.levels.top, job.name)
        tiers = sibling_affinity(self.cluster.nodes, names, siblings, self.keys) if siblings else {}
        for name in sorted(names, key=lambda n: (-tiers.get(n, 0.0), self._free(n), n)):
            got = allocate(self.cluster.nodes[name], req)
            if isinstance(got, Allocation):
                return name, got
        return None

    def _free(self, name: str) -> int:
        return GPUSummary.of(self.cluster.nodes[name]).whole_free

    def _started(self, job: Job, now: float) -> None:
        if len(job.placed) < len(job.gpus):
            return
        self.waiting.remove(job)
        job.started = now
        if job.kind != "batch":
            self.waits[job.kind].append(now - job.arrived)
            labels = [self.cluster.nodes[n].labels for n in job.placed.values()]
            self.spans[job.kind].append((len({lb[LEAF] for lb in labels}), len({lb[SPINE] for lb in labels})))
        heapq.heappush(self.events, (now + job.hours, next(self.seq), "finish", job))

    def _finish(self, job: Job, now: float) -> None:
        self.busy += (now - job.started) * sum(job.gpus)
        for key in job.placed:
            self.cluster.unassign(key)


def run_topology_mix(
    settings: TopologyMixSettings, policy: str, progress: Callable[[float], None] = lambda _: None
) -> TopologyMixResult:
    sim = _Sim(settings, policy)
    result = sim.run(workload(settings, sim.gpus), progress)
    horizon = settings.days * 24
    return TopologyMixResult(
        result.policy, result.gangs, result.groups, result.gpu_use / (sim.gpus * horizon)
    )
