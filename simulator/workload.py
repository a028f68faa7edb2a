"""A workload of jobs and gangs from YAML, optionally mixed with openb trace pods, as an arrival
stream for `topoalloc simulate --workload FILE`.

```yaml
trace:                    # optional: openb pods, shuffled per seed and stretched or cut
  pods: sample            # sample (the bundled 1,000 pods of openb default), a trace name, or a CSV
  fill: 1.3               # arrived GPU demand, jobs included, as a share of the cluster's GPUs
jobs:
  - name: pretrain        # pods pretrain-0, pretrain-1, ...
    replicas: 2
    gang: true            # all members or none (label scheduling.x-k8s.io/pod-group: pretrain)
    at: 0.4               # arrives after 40% of the trace pods (default 0: before them, in file order)
    reserveAhead: 200     # optional: a Reservation for it this many arrivals earlier (a gang, or
                          # one replica; `topoalloc simulate` then reports the wait it saves)
    gpuModels: [H100-80GB-HBM3]   # required node affinity on node.koordinator.sh/gpu-model
    requests: {cpu: "96", memory: 1000Gi, nvidia.com/gpu: "8"}
    labels: {}            # optional; annotations: {} too (device hints, joint allocation, ...)
  - name: notebooks
    replicas: 20
    pod: {...}            # instead of requests: a whole Pod template (its name is replaced)
  - name: dra-pairs       # each pod's GPUs from DRA claims, placed as the claims controller places
    replicas: 8           # them (allocator/core/request/claims.py: whole GPUs, the scope or
    requests: {cpu: "8"}  # partition a matchAttribute names); GPU requests only, no slices to check
    claims:               # attributes against: the simulator has no per-device attributes
      - requests: [{name: gpus, exactly: {deviceClassName: gpu.topoalloc.io, count: 2}}]
        constraints: [{matchAttribute: topoalloc.io/nvlinkPartition2}]
```
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from allocator.core.reasons import Rejection
from allocator.core.request.claims import OURS, classify, translate
from allocator.core.request.parse import pod_request
from allocator.core.scoring.workload_mix import WorkloadMix
from apis import dra, keys
from apis.documents import load_object
from apis.dra_claims import ClaimSpec, claim_spec, default_classes
from apis.errors import CodecError, InputError
from simulator.cluster import RequestFactory, SimRequest
from simulator.engine import Arrival, OpenbRequests
from simulator.gang_planner import Gang
from simulator.objects import NAMESPACE, pod_object
from simulator.openb import GPU_MILLI, OpenbPod, TraceError, load_pods, resolve_trace
from simulator.protocol import tune

SAMPLE = Path(__file__).resolve().parent / "data" / "openb_default_sample.csv"


@dataclass(frozen=True)
class Job:
    name: str
    replicas: int
    gang: bool
    at: float
    pod: dict[str, Any]  # template
    reserve_ahead: int = 0  # arrivals between its Reservation and its arrival (0: none)
    claims: tuple[ClaimSpec, ...] = ()  # spec.devices of each DRA claim of every pod


@dataclass(frozen=True)
class TraceSpec:
    pods: str = "sample"
    fill: float = 1.3


@dataclass(frozen=True)
class Workload:
    name: str
    jobs: tuple[Job, ...]
    trace: TraceSpec | None


def _job(item: Any, i: int) -> Job:
    where = f"jobs[{i}]"
    if not isinstance(item, Mapping):
        raise TraceError(f"{where}: expected a mapping")
    unknown = set(item) - {
        "name",
        "replicas",
        "gang",
        "at",
        "gpuModels",
        "requests",
        "labels",
        "annotations",
        "pod",
        "reserveAhead",
        "claims",
    }
    if unknown:
        raise TraceError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    name = str(item.get("name") or "")
    if not name:
        raise TraceError(f"{where}: a job needs a name")
    try:
        replicas = int(item.get("replicas", 1))
        at = float(item.get("at", 0.0))
    except (TypeError, ValueError):
        raise TraceError(f"{where}: replicas must be an integer and at a number") from None
    if replicas < 1 or not 0.0 <= at <= 1.0:
        raise TraceError(f"{where}: replicas must be >= 1 and at within 0..1")
    gang = bool(item.get("gang", False))
    try:
        ahead = int(item.get("reserveAhead", 0))
    except (TypeError, ValueError):
        raise TraceError(f"{where}: reserveAhead must be a number of arrivals") from None
    if ahead < 0 or (ahead and not gang and replicas != 1):
        raise TraceError(f"{where}: reserveAhead must be >= 0, on a gang or a job of one replica")
    if "pod" in item:
        if "requests" in item:
            raise TraceError(f"{where}: give either requests or pod, not both")
        pod = item["pod"]
        if not isinstance(pod, Mapping):
            raise TraceError(f"{where}.pod: expected a Pod object")
        pod = dict(pod)
    else:
        requests = item.get("requests")
        if not isinstance(requests, Mapping) or not requests:
            raise TraceError(f"{where}: needs requests (or a pod template)")
        models = tuple(str(m) for m in item.get("gpuModels") or ())
        pod = pod_object(
            name,
            {str(k): str(v) for k, v in requests.items()},
            models=models,
            labels={str(k): str(v) for k, v in (item.get("labels") or {}).items()},
            annotations={str(k): str(v) for k, v in (item.get("annotations") or {}).items()},
        )
    if gang:
        meta = pod.setdefault("metadata", {})
        meta.setdefault("labels", {})[keys.POD_GROUP_LABEL] = name
    return Job(name, replicas, gang, at, pod, ahead, _claims(item.get("claims"), where))


def _claims(value: Any, where: str) -> tuple[ClaimSpec, ...]:
    """The job's DRA claims: each a claim's spec.devices, every request one of topoalloc's GPU
    classes (the simulator models GPUs only)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise TraceError(f"{where}.claims: expected a list of claim specs (spec.devices)")
    out = []
    for i, item in enumerate(value):
        path = f"{where}.claims[{i}]"
        try:
            spec = claim_spec(item, path)
        except CodecError as exc:
            raise TraceError(str(exc)) from None
        verdict = classify(spec, opted_out=False)
        if verdict.kind != OURS or any(
            r.exactly and r.exactly.device_class != dra.GPU_CLASS for r in spec.requests
        ):
            raise TraceError(f"{path}: the simulator allocates claims of {dra.GPU_CLASS} only")
        out.append(spec)
    return tuple(out)


def load_workload(path: Path | str) -> Workload:
    path = Path(path)
    try:
        data = load_object(path, "workload")
    except InputError as exc:
        raise TraceError(str(exc)) from None
    return parse_workload(data, path.stem)


def parse_workload(data: Any, name: str = "workload") -> Workload:
    if not isinstance(data, Mapping):
        raise TraceError("a workload is a mapping with jobs and/or trace")
    unknown = set(data) - {"jobs", "trace"}
    if unknown:
        raise TraceError(f"workload: unknown field(s) {', '.join(sorted(unknown))}")
    jobs = tuple(_job(item, i) for i, item in enumerate(data.get("jobs") or ()))
    trace = None
    if data.get("trace") is not None:
        spec = data["trace"]
        if not isinstance(spec, Mapping) or set(spec) - {"pods", "fill"}:
            raise TraceError("trace: expected {pods, fill}")
        try:
            trace = TraceSpec(str(spec.get("pods", "sample")), float(spec.get("fill", 1.3)))
        except ValueError:
            raise TraceError("trace.fill: expected a number") from None
    if not jobs and trace is None:
        raise TraceError("the workload has no jobs and no trace")
    return Workload(name, jobs, trace)


def trace_pods(spec: TraceSpec) -> list[OpenbPod]:
    return load_pods(SAMPLE if spec.pods == "sample" else resolve_trace(spec.pods))


def _job_arrivals(job: Job, factory: RequestFactory) -> list[Arrival]:
    members: list[SimRequest] = []
    for r in range(job.replicas):
        pod = {**job.pod, "metadata": {**(job.pod.get("metadata") or {})}}
        pod["metadata"]["name"] = f"{job.name}-{r}"
        pod["metadata"].setdefault("namespace", NAMESPACE)
        parsed = None
        if job.claims:
            claims = [(f"{NAMESPACE}/{job.name}-{i}", c) for i, c in enumerate(job.claims)]
            creq = translate(pod_request(pod), claims, default_classes())
            if isinstance(creq, Rejection):
                raise TraceError(f"job {job.name}: {creq.message}")
            parsed = creq.pod
        gang = job.name if job.gang else ""
        members.append(factory.request(pod, template=("job", job.name), gang=gang, parsed=parsed))
    if job.gang:
        return [Gang(job.name, tuple(members))]
    return list(members)


def target_mix(workload: Workload, original: Sequence[OpenbPod]) -> WorkloadMix:
    """FGD's target workload for a run: the shapes of the trace pods before tuning and of every
    job's pods (the fragmentation metric and the FGD baseline plan for it)."""
    factory = RequestFactory()
    shapes = [p.shape() for p in original]
    for job in workload.jobs:
        for item in _job_arrivals(job, factory):
            members = item.members if isinstance(item, Gang) else (item,)
            shapes.extend(m.shape for m in members)
    return WorkloadMix.from_tasks(shapes)


def arrivals(
    workload: Workload, capacity_pct: int, seed: int, original: Sequence[OpenbPod] = ()
) -> list[Arrival]:
    """The stream for one seed: trace pods (name order, seeded shuffle, stretched or cut to the
    fill target less the jobs' demand, as the paper protocol tunes) with the jobs inserted at
    their positions."""
    openb = OpenbRequests()
    jobs = [(job, _job_arrivals(job, openb.factory)) for job in workload.jobs]
    stream: list[Arrival] = []
    if workload.trace is not None and original:
        rng = random.Random(seed)
        by_name = sorted(original, key=lambda p: p.name)
        ordered = list(by_name)
        rng.shuffle(ordered)
        job_demand = sum(a.demand_pct for _, items in jobs for a in items)
        target_milli = max(workload.trace.fill * capacity_pct - job_demand, 0) * GPU_MILLI / 100
        stream = [openb(p) for p in tune(ordered, by_name, target_milli, rng)]
    out: list[Arrival] = []
    placed_jobs = sorted(jobs, key=lambda j: j[0].at)  # stable: file order among equal positions
    cursor = 0
    for job, items in placed_jobs:
        position = round(job.at * len(stream))
        out.extend(stream[cursor:position])
        cursor = max(cursor, position)
        out.extend(items)
    out.extend(stream[cursor:])
    return out
