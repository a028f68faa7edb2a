"""A pod's request as the allocator sees it, parsed once per pod (protocol section 3).

`pod_request(pod)` never raises: a malformed annotation or an invalid combination of device
resources yields a `PodRequest` whose `invalid` is set, so every node can answer with the same
clear reason.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from allocator.core import reasons as rs
from allocator.core.reasons import Rejection
from allocator.core.request.pod_request import (
    TYPE_ORDER,
    WHOLE_GPU,
    GPURequirement,
    PodRequest,
    Resources,
    SelectorTerm,
    as_resources,
    required_gpu_models,
)
from allocator.core.request.usage import effective_requests, exclusive_cpus
from apis import keys
from apis import resources as rn
from apis.annotations import (
    DeviceAllocateHints,
    DeviceHint,
    DeviceJointAllocate,
    GPUPartitionSpec,
    parse_device_allocate_hint,
    parse_device_allocated,
    parse_device_joint_allocate,
    parse_gpu_partition_spec,
    parse_numa_topology_spec,
)
from apis.errors import CodecError
from apis.pod_checks import annotation_warnings, resource_warnings
from apis.podgroup import gang_of, spec_priority
from apis.quantity import NANO

_GPU_NAMES = tuple(n for n, t in rn.RESOURCE_DEVICE_TYPE.items() if t == rn.DeviceType.GPU)
_TYPE_NAMES: dict[str, tuple[str, ...]] = {
    rn.DeviceType.GPU: _GPU_NAMES,
    rn.DeviceType.RDMA: (rn.RDMA,),
    rn.DeviceType.FPGA: (rn.FPGA,),
}
_PERCENT_UNITS = (rn.GPU, rn.FPGA, rn.RDMA)

# The sets of GPU resource names Koordinator accepts together (protocol 3.1), with the rule
# each set must pass.
_PERCENT, _SHARED, _NPU, _ANY = "percent", "shared", "npu", "any"
_GPU_COMBINATIONS: dict[frozenset[str], str] = {
    frozenset({rn.NVIDIA_GPU}): _ANY,
    frozenset({rn.AMD_GPU}): _ANY,
    frozenset({rn.HYGON_DCU}): _ANY,
    frozenset({rn.GPU}): _ANY,
    frozenset({rn.GPU_MEMORY}): _PERCENT,
    frozenset({rn.GPU_MEMORY_RATIO}): _PERCENT,
    frozenset({rn.GPU_CORE, rn.GPU_MEMORY}): _PERCENT,
    frozenset({rn.GPU_CORE, rn.GPU_MEMORY_RATIO}): _PERCENT,
    frozenset({rn.NPU_CORE, rn.GPU_MEMORY_RATIO}): _PERCENT,
    frozenset({rn.GPU_SHARED, rn.GPU_MEMORY}): _SHARED,
    frozenset({rn.GPU_SHARED, rn.GPU_MEMORY_RATIO}): _SHARED,
    frozenset({rn.GPU_SHARED, rn.GPU_CORE, rn.GPU_MEMORY}): _SHARED,
    frozenset({rn.GPU_SHARED, rn.GPU_CORE, rn.GPU_MEMORY_RATIO}): _SHARED,
    frozenset({rn.GPU_SHARED, rn.NPU_CORE, rn.NPU_CPU, rn.GPU_MEMORY}): _NPU,
    frozenset({rn.GPU_SHARED, rn.NPU_CORE, rn.NPU_CPU, rn.NPU_DVPP, rn.GPU_MEMORY}): _NPU,
}
T = TypeVar("T")


class _Invalid(Exception):
    def __init__(self, rejection: Rejection) -> None:
        super().__init__(rejection.message)
        self.rejection = rejection


def pod_request(pod: Any) -> PodRequest:
    """Parse a Pod dict. Never raises: bad input gives a request with `invalid` set."""
    meta = pod.get("metadata") if isinstance(pod, dict) else None
    meta = meta if isinstance(meta, dict) else {}
    namespace = meta.get("namespace") if isinstance(meta.get("namespace"), str) else "default"
    name = meta.get("name") if isinstance(meta.get("name"), str) else ""
    uid = meta.get("uid") if isinstance(meta.get("uid"), str) else ""
    base = {"key": f"{namespace}/{name}", "namespace": namespace or "default", "name": name, "uid": uid}
    try:
        fields = _parse(pod, meta)
    except _Invalid as exc:
        req = PodRequest(**base, invalid=exc.rejection)
        return with_signature(req)
    return with_signature(PodRequest(**base, **fields))


def _parse(pod: Any, meta: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(pod, dict):
        raise _Invalid(rs.invalid(rs.INVALID_POD, "the pod is not an object"))
    if not isinstance(pod.get("metadata", {}), dict):
        raise _Invalid(rs.invalid(rs.INVALID_POD, "metadata: expected an object"))
    labels = _str_map(meta.get("labels"), "metadata.labels")
    annotations = _str_map(meta.get("annotations"), "metadata.annotations")
    spec = pod.get("spec")
    if spec is None:
        spec = {}
    if not isinstance(spec, dict):
        raise _Invalid(rs.invalid(rs.INVALID_POD, "spec: expected an object"))
    try:
        requests, nonzero_cpu, nonzero_mem = effective_requests(spec)
    except CodecError as exc:
        raise _Invalid(rs.invalid(rs.INVALID_POD, f"invalid container resources: {exc}")) from None

    out: dict[str, Any] = {}
    cpu = requests.pop(rn.CPU, 0)
    mem = requests.pop(rn.MEMORY, 0)
    out["cpu_milli"] = -(-cpu // (NANO // 1000))
    out["memory"] = -(-mem // NANO)
    out["nonzero_cpu_milli"] = nonzero_cpu
    out["nonzero_memory"] = nonzero_mem
    out["exclusive_cpus"] = exclusive_cpus(spec)
    out["scalars"] = {k: -(-v // NANO) for k, v in sorted(requests.items()) if v > 0}
    out["warnings"] = (*annotation_warnings(annotations), *resource_warnings(out["scalars"]))

    devices = _device_requests(out["scalars"])
    out["devices"] = devices
    raw_allocated = annotations.get(keys.DEVICE_ALLOCATED)
    if raw_allocated is not None:
        # Koordinator reports the raw decoding error as the reason.
        out["designated"] = _parsed(parse_device_allocated, raw_allocated, keys.DEVICE_ALLOCATED, "{err}")
    if devices:
        out.update(_device_extensions(annotations, dict(devices)))
    provider = labels.get(keys.GPU_ISOLATION_PROVIDER, "")
    out["isolation_provider"] = provider
    numa = annotations.get(keys.NUMA_TOPOLOGY_SPEC)
    if numa is not None:
        out["numa_spec"] = _parsed(parse_numa_topology_spec, numa, keys.NUMA_TOPOLOGY_SPEC, "{err}")
    out["node_selector"] = _str_map(spec.get("nodeSelector"), "spec.nodeSelector")
    out["affinity_terms"] = _affinity_terms(spec.get("affinity"))
    try:
        out["gang"] = gang_of(pod)
    except (CodecError, AttributeError, TypeError) as exc:
        out["gang_error"] = str(exc)
    out["rl_job_group"] = labels.get(keys.RL_JOB_GROUP, "")
    out["priority"] = spec_priority(spec)
    return out


def _str_map(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise _Invalid(rs.invalid(rs.INVALID_POD, f"{where}: expected a map of strings"))
    return value


# -- device requests (protocol 3.1) ----------------------------------------------------------------


def _device_requests(scalars: Mapping[str, int]) -> tuple[tuple[str, Resources], ...]:
    out = []
    for dtype in TYPE_ORDER:
        subset = {n: scalars[n] for n in _TYPE_NAMES[dtype] if scalars.get(n, 0) > 0}
        if not subset:
            continue
        for name in _PERCENT_UNITS:
            value = subset.get(name)
            if value is not None and not _percent_ok(value):
                raise _Invalid(
                    rs.invalid(
                        rs.INVALID_UNIT.format(name=name, quantity=value),
                        f"{name} must be at most 100 or a multiple of 100 (got {value})",
                    )
                )
        converted = _convert(dtype, subset)
        out.append((dtype, as_resources(converted)))
    return tuple(out)


def _percent_ok(value: int) -> bool:
    return value <= 100 or value % 100 == 0


def _convert(dtype: str, subset: dict[str, int]) -> dict[str, int]:
    if dtype != rn.DeviceType.GPU:
        return dict(subset)
    names = frozenset(subset)
    rule = _GPU_COMBINATIONS.get(names)
    # A valid set of names with an amount out of range says which amount.
    problem = None if rule is None else _amount_problem(rule, subset)
    if rule is None or problem is not None:
        listed = " ".join(sorted(names))
        message = problem or f"unsupported combination of GPU resources: {', '.join(sorted(names))}"
        raise _Invalid(rs.invalid(rs.INVALID_COMBINATION.format(names=listed), message))
    for whole in rn.WHOLE_GPU_RESOURCES:
        if whole in subset:
            n = subset[whole]
            return {rn.GPU_CORE: 100 * n, rn.GPU_MEMORY_RATIO: 100 * n}
    if rn.GPU in subset:
        return {rn.GPU_CORE: subset[rn.GPU], rn.GPU_MEMORY_RATIO: subset[rn.GPU]}
    return dict(subset)


def _amount_problem(rule: str, req: Mapping[str, int]) -> str | None:
    """Why the amounts of a valid combination of names are out of range, in the user's terms;
    None when they are in range."""
    if rule == _PERCENT:
        for name in (rn.GPU_CORE, rn.GPU_MEMORY_RATIO):
            if name in req and not _percent_ok(req[name]):
                return (
                    f"{name} is a percentage of one GPU: at most 100, or a multiple of 100 for whole GPUs"
                    f" (got {req[name]})"
                )
    if rule == _SHARED:
        shared = req[rn.GPU_SHARED]
        for name in (rn.GPU_CORE, rn.GPU_MEMORY_RATIO):
            if name in req and (req[name] % shared != 0 or req[name] // shared > 100):
                return (
                    f"{name} must split evenly over the {shared} shared GPUs, at most 100 each"
                    f" (got {req[name]})"
                )
    if rule == _NPU and (req[rn.GPU_SHARED] > 1 or req.get(rn.NPU_DVPP, 0) > 100):
        return f"{rn.GPU_SHARED} must be 1 and {rn.NPU_DVPP} at most 100 for NPU requests"
    return None


def gpu_requirement(
    gpu: Mapping[str, int], hint: DeviceHint | None, spec: GPUPartitionSpec | None
) -> GPURequirement:
    """Per-GPU request and GPU count from the internal gpu request (protocol 3.2)."""
    count = 1
    if gpu.get(rn.GPU_SHARED, 0) > 0:
        count = gpu[rn.GPU_SHARED]
    elif gpu.get(rn.GPU_MEMORY_RATIO, 0) > 100 and gpu[rn.GPU_MEMORY_RATIO] % 100 == 0:
        count = gpu[rn.GPU_MEMORY_RATIO] // 100
    per: dict[str, int] = {}
    for name in (rn.GPU_CORE, rn.NPU_CORE, rn.NPU_CPU, rn.NPU_DVPP):
        if name in gpu:
            per[name] = gpu[name] // count
    shared = False
    if rn.GPU_MEMORY_RATIO in gpu:
        per[rn.GPU_MEMORY_RATIO] = gpu[rn.GPU_MEMORY_RATIO] // count
        shared = per[rn.GPU_MEMORY_RATIO] < 100
    elif rn.GPU_MEMORY in gpu:
        per[rn.GPU_MEMORY] = gpu[rn.GPU_MEMORY] // count
        shared = True
    scope = hint.required_topology_scope if hint is not None else ""
    per_gpu = as_resources(per)
    return GPURequirement(
        count=count,
        per_gpu=per_gpu,
        shared=shared,
        honor_partition=spec is not None,
        restricted_partition=spec is not None and spec.restricted,
        ring_bus_bandwidth=None
        if spec is None or spec.ring_bus_bandwidth is None
        else spec.ring_bus_bandwidth.nanos,
        required_scope=scope,
        scope_level=hint.scope_level if hint is not None else 0,
        whole=per_gpu == WHOLE_GPU,
        equal_share=per[rn.GPU_CORE]
        if per.keys() == {rn.GPU_CORE, rn.GPU_MEMORY_RATIO} and per[rn.GPU_CORE] == per[rn.GPU_MEMORY_RATIO]
        else None,
    )


def _device_extensions(annotations: Mapping[str, str], devices: dict[str, Resources]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    hints = DeviceAllocateHints()
    raw = annotations.get(keys.DEVICE_ALLOCATE_HINT)
    if raw is not None:
        try:
            hints = parse_device_allocate_hint(raw)
        except CodecError as exc:
            raise _Invalid(_hint_error(exc)) from None
    out["hints"] = {t: h for t, h in hints.by_type.items() if h is not None}

    joint = DeviceJointAllocate()
    raw = annotations.get(keys.DEVICE_JOINT_ALLOCATE)
    if raw is not None:
        joint = _parsed(parse_device_joint_allocate, raw, keys.DEVICE_JOINT_ALLOCATE, rs.INVALID_JOINT)
    kept = []
    for dtype in joint.device_types:
        h = out["hints"].get(dtype)
        if h is not None and h.allocate_strategy == "ApplyForAll":
            continue
        if dtype in devices and dtype not in kept:
            kept.append(dtype)
    out["joint_types"] = tuple(kept)
    out["joint_same_pcie"] = joint.required_scope == "SamePCIe"

    spec = None
    raw = annotations.get(keys.GPU_PARTITION_SPEC)
    if raw is not None and rn.DeviceType.GPU in devices:
        spec = _parsed(parse_gpu_partition_spec, raw, keys.GPU_PARTITION_SPEC, rs.INVALID_PARTITION_SPEC)
    out["partition_spec"] = spec
    if rn.DeviceType.GPU in devices:
        out["gpu"] = gpu_requirement(
            dict(devices[rn.DeviceType.GPU]), out["hints"].get(rn.DeviceType.GPU), spec
        )
    return out


def _parsed(parse: Callable[[str], T], raw: str, key: str, code: str) -> T:
    """An annotation decoded, or the pod made invalid with Koordinator's code for that annotation."""
    try:
        return parse(raw)
    except CodecError as exc:
        raise _Invalid(rs.invalid(code.format(err=exc), annotation_problem(key, exc))) from None


def _hint_error(exc: CodecError) -> Rejection:
    text = str(exc)
    field_path = exc.field or ""
    for dtype in TYPE_ORDER:
        prefix = f"{keys.DEVICE_ALLOCATE_HINT}.{dtype}."
        for name, code in (("selector", rs.INVALID_SELECTOR), ("vfSelector", rs.INVALID_VF_SELECTOR)):
            if field_path.startswith(prefix + name):
                return rs.invalid(
                    code.format(type=dtype, err=text),
                    f"invalid {keys.DEVICE_ALLOCATE_HINT} annotation: {dtype} {name}: "
                    f"{_problem(exc, prefix + name)}",
                )
    return rs.invalid(rs.INVALID_HINT.format(err=text), annotation_problem(keys.DEVICE_ALLOCATE_HINT, exc))


def annotation_problem(key: str, exc: CodecError) -> str:
    """'invalid <key> annotation: <field inside it>: <problem>', without repeating the key."""
    return f"invalid {key} annotation: {_problem(exc, key)}"


def _problem(exc: CodecError, prefix: str) -> str:
    field = exc.field or ""
    inner = field[len(prefix) :].lstrip(".") if field.startswith(prefix) else field
    text = str(exc)
    problem = text[len(field) + 2 :] if field and text.startswith(field + ": ") else text
    return f"{inner}: {problem}" if inner else problem


# -- node affinity ---------------------------------------------------------------------------------

_NODE_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


def _affinity_terms(affinity: Any) -> tuple[SelectorTerm, ...] | None:
    if affinity is None:
        return None
    try:
        node_aff = affinity.get("nodeAffinity") if isinstance(affinity, dict) else None
        if not node_aff:
            return None
        required = node_aff.get("requiredDuringSchedulingIgnoredDuringExecution")
        if required is None:
            return None
        terms = required.get("nodeSelectorTerms") or []
        return tuple(
            SelectorTerm(
                _requirements(t.get("matchExpressions") or []), _requirements(t.get("matchFields") or [])
            )
            for t in terms
        )
    except (AttributeError, TypeError, ValueError) as exc:
        raise _Invalid(rs.invalid(rs.INVALID_POD, f"invalid required node affinity: {exc}")) from None


def _requirements(items: Iterable[Any]) -> tuple[tuple[str, str, tuple[str, ...]], ...]:
    out = []
    for item in items:
        op = item["operator"]
        if op not in _NODE_OPERATORS:
            raise ValueError(f"unknown operator {op!r}")
        values = item.get("values") or []
        out.append((str(item["key"]), op, tuple(str(v) for v in values)))
    return tuple(out)


# -- signature -------------------------------------------------------------------------------------


def with_signature(req: PodRequest) -> PodRequest:
    """`req` with its signature computed (also for requests built from claims, request/claims.py)."""
    hints = tuple(sorted((t, DeviceAllocateHints({t: h}).to_json()) for t, h in req.hints.items()))
    sig = (
        req.invalid,
        req.devices,
        req.gpu,
        hints,
        req.joint_types,
        req.joint_same_pcie,
        req.isolation_provider,
        None if req.numa_spec is None else req.numa_spec.to_json(),
        req.cpu_milli,
        req.memory,
        req.exclusive_cpus,
        req.nonzero_cpu_milli,
        req.nonzero_memory,
        tuple(sorted(req.scalars.items())),
        # the GPU models it is held to: scores differ (fragmentation's model pressure, topology)
        required_gpu_models(req),
    )
    object.__setattr__(req, "signature", sig)
    return req
