"""What kube-scheduler sees of a pod spec: effective requests (PodRequests, with sidecars and
overhead) and what a pod already bound to a node takes there."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from apis import keys
from apis import resources as rn
from apis.annotations import DeviceAllocations, allocated_elsewhere, parse_device_allocated
from apis.errors import CodecError
from apis.podresources import resource_quantity
from apis.quantity import NANO

# The key a ResourceClaim's devices are counted under on its node, beside the pods' keys
# ("namespace/name"): a claim takes devices but is no pod (NodeState.pod_count skips it).
CLAIM_KEY_PREFIX = "claim:"


# The key a Reservation's room is counted under (core/reservation/room.py): it holds devices, cpu
# and memory for its owners, but kubelet never hears of it (node/kubelet_view.py skips it).
ROOM_KEY_PREFIX = "reservation:"  # a pod key always has one "/", a namespace never a ":"


def claim_usage_key(claim_key: str) -> str:
    return CLAIM_KEY_PREFIX + claim_key


# kube-scheduler's defaults for containers without a cpu / memory request (scoring only).
DEFAULT_CPU_MILLI = 100
DEFAULT_MEMORY = 200 * 1024 * 1024


def effective_requests(spec: Mapping[str, Any]) -> tuple[dict[str, int], int, int]:
    """The pod's requests in nano-units as kube-scheduler computes them, plus the non-zero cpu
    (milli) and memory (bytes) that its scoring uses.

    Regular containers add up; a sidecar (init container with restartPolicy Always) adds to that
    sum and stays running while later init containers run; each other init container needs its
    own request plus the sidecars started before it; the pod needs the maximum of all that, plus
    spec.overhead.
    """
    containers = _container_list(spec, "containers")
    inits = _container_list(spec, "initContainers")
    overhead = _resource_list(spec.get("overhead"), "spec.overhead")

    total: dict[str, int] = {}
    nz_cpu = nz_mem = 0
    for c in containers:
        reqs = _requests_of(c)
        _add(total, reqs)
        nz_cpu += _nonzero(reqs, rn.CPU)
        nz_mem += _nonzero(reqs, rn.MEMORY)
    sidecars: dict[str, int] = {}
    init_max: dict[str, int] = {}
    nz_sidecar_cpu = nz_sidecar_mem = 0
    nz_init_cpu = nz_init_mem = 0
    for c in inits:
        reqs = _requests_of(c)
        cpu_nz, mem_nz = _nonzero(reqs, rn.CPU), _nonzero(reqs, rn.MEMORY)
        if c.get("restartPolicy") == "Always":
            _add(total, reqs)
            _add(sidecars, reqs)
            nz_cpu += cpu_nz
            nz_mem += mem_nz
            nz_sidecar_cpu += cpu_nz
            nz_sidecar_mem += mem_nz
            need = dict(sidecars)
            cpu_need, mem_need = nz_sidecar_cpu, nz_sidecar_mem
        else:
            need = dict(reqs)
            _add(need, sidecars)
            cpu_need, mem_need = cpu_nz + nz_sidecar_cpu, mem_nz + nz_sidecar_mem
        for name, value in need.items():
            init_max[name] = max(init_max.get(name, 0), value)
        nz_init_cpu = max(nz_init_cpu, cpu_need)
        nz_init_mem = max(nz_init_mem, mem_need)
    for name, value in init_max.items():
        total[name] = max(total.get(name, 0), value)
    nz_cpu = max(nz_cpu, nz_init_cpu)
    nz_mem = max(nz_mem, nz_init_mem)
    _add(total, overhead)
    nz_cpu += -(-overhead.get(rn.CPU, 0) // (NANO // 1000))
    nz_mem += -(-overhead.get(rn.MEMORY, 0) // NANO)
    return {k: v for k, v in total.items() if v != 0}, nz_cpu, nz_mem


def _container_list(spec: Mapping[str, Any], name: str) -> list[dict[str, Any]]:
    value = spec.get(name) or []
    if not isinstance(value, list) or not all(isinstance(c, dict) for c in value):
        raise CodecError(f"spec.{name}", "expected a list of containers", value)
    return value


def _requests_of(container: Mapping[str, Any]) -> dict[str, int]:
    res = container.get("resources") or {}
    if not isinstance(res, dict):
        raise CodecError("resources", "expected an object", res)
    # kube-apiserver defaults missing requests to limits; do the same for pods never admitted.
    limits = _resource_list(res.get("limits"), "resources.limits")
    requests = _resource_list(res.get("requests"), "resources.requests")
    return {**limits, **requests}


def _resource_list(value: Any, where: str) -> dict[str, int]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise CodecError(where, "expected a map of quantities", value)
    return {str(k): resource_quantity(str(k), v, f"{where}.{k}").nanos for k, v in value.items()}


def _nonzero(reqs: Mapping[str, int], name: str) -> int:
    if name not in reqs:
        return DEFAULT_CPU_MILLI if name == rn.CPU else DEFAULT_MEMORY
    nanos = reqs[name]
    return -(-nanos // (NANO // 1000)) if name == rn.CPU else -(-nanos // NANO)


def _add(into: dict[str, int], other: Mapping[str, int]) -> None:
    for name, value in other.items():
        into[name] = into.get(name, 0) + value


@dataclass(frozen=True, slots=True)
class PodUsage:
    """What a pod already on a node takes there: its devices and its cpu/memory requests."""

    key: str
    node: str
    allocations: DeviceAllocations | None
    cpu_milli: int
    memory: int
    nonzero_cpu_milli: int
    nonzero_memory: int
    error: str = ""  # a device-allocated annotation that does not parse: it then counts as none
    # What kubelet's Topology Manager counts (allocator/core/node/kubelet_view.py): the CPUs the
    # static CPU manager pins for it, and whether its GPUs are `nvidia.com/gpu` (whole) IDs or its
    # shares `koordinator.sh/gpu` IDs (else `gpu-core` IDs).
    exclusive_cpus: int = 0
    whole_cards: bool = False
    koord_shares: bool = False


def pod_usage(pod: Mapping[str, Any]) -> PodUsage:
    """Usage of a bound pod for NodeState.add_pod. Terminated pods use nothing."""
    meta = pod.get("metadata") or {}
    key = f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}"
    spec = pod.get("spec") or {}
    node = spec.get("nodeName") or ""
    phase = (pod.get("status") or {}).get("phase")
    if phase in rn.TERMINAL_POD_PHASES:
        return PodUsage(key, node, None, 0, 0, 0, 0)
    error = ""
    try:
        requests, nz_cpu, nz_mem = effective_requests(spec)
    except CodecError as exc:
        requests, nz_cpu, nz_mem, error = {}, 0, 0, str(exc)
    allocations = None
    annotations = meta.get("annotations") or {}
    raw = annotations.get(keys.DEVICE_ALLOCATED)
    # made for another node (the pod was bound elsewhere than placed): no devices here until the
    # node's agent writes what it chose
    if raw is not None and not allocated_elsewhere(annotations, node):
        try:
            allocations = parse_device_allocated(raw)
        except CodecError as exc:
            error = str(exc)
    return PodUsage(
        key,
        node,
        allocations,
        -(-requests.get(rn.CPU, 0) // (NANO // 1000)),
        -(-requests.get(rn.MEMORY, 0) // NANO),
        nz_cpu,
        nz_mem,
        error,
        exclusive_cpus=exclusive_cpus(spec),
        whole_cards=requests.get(rn.NVIDIA_GPU, 0) > 0,
        koord_shares=requests.get(rn.GPU, 0) > 0,
    )


def exclusive_cpus(spec: Mapping[str, Any]) -> int:
    """The CPUs kubelet's static CPU manager pins for the pod: in a Guaranteed pod (every container
    limits cpu and memory, requests equal to limits), the whole-CPU requests of its regular
    containers and sidecars. 0 for anything else, and for a spec that does not decode."""
    try:
        containers = _container_list(spec, "containers")
        inits = _container_list(spec, "initContainers")
        total = 0
        for pinned, c in [
            *((i.get("restartPolicy") == "Always", i) for i in inits),
            *((True, c) for c in containers),
        ]:
            res = c.get("resources") or {}
            limits = _resource_list(res.get("limits"), "resources.limits")
            requests = _resource_list(res.get("requests"), "resources.requests")
            if rn.CPU not in limits or rn.MEMORY not in limits:
                return 0
            if any(requests.get(n, limits[n]) != limits[n] for n in (rn.CPU, rn.MEMORY)):
                return 0
            if pinned and limits[rn.CPU] % NANO == 0:
                total += limits[rn.CPU] // NANO
        return total
    except (CodecError, AttributeError, TypeError):
        return 0
