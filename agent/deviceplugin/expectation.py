"""What kubelet must hand each container of a pod, read from the pod's `device-allocated` annotation.

The annotation is per pod; kubelet allocates per container. Each served resource's annotation entries
are handed to the containers that request the resource in spec order, each taking entries until
their units add up to its request (a whole GPU is 1 unit of `nvidia.com/gpu`; for `gpu-core` and
`koordinator.sh/gpu` an entry is its `koordinator.sh/gpu-core` value; an RDMA entry its
`koordinator.sh/rdma` value). Anything that
does not add up exactly is an error: the pod is refused, never given a guess.

One exception: the allocator may give an RDMA request more NICs than units (Koordinator's SamePCIe
rule takes one NIC per GPU PCIe root even for `koordinator.sh/rdma: 1`). Then the one container
that requests RDMA gets every annotated NIC, and its kubelet IDs may come from any of them.

Pure: pod dict + inventory in, plain data out.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from agent.deviceplugin.inventory import GPU_RESOURCES, Inventory, base_of
from apis import keys
from apis import resources as rn
from apis.annotations import DeviceAllocation, parse_device_allocated
from apis.errors import CodecError
from apis.podresources import resource_quantity


class ExpectationError(ValueError):
    """The pod cannot be served as annotated; the message is the reason shown to the user."""


@dataclass(frozen=True)
class ContainerExpectation:
    container: str
    count: int  # kubelet device IDs this container requests
    entries: tuple[DeviceAllocation, ...]  # the annotation entries it gets, in annotation order
    bases: tuple[str, ...]  # GPU UUIDs / PF addresses of those entries, same order
    counts: tuple[tuple[str, int], ...] | None  # exact IDs per base; None: any split over `bases`
    why: str = ""  # set when the node chose these devices (on_node.py): why it did

    def accepts(self, resource: str, ids: list[str]) -> bool:
        """Whether kubelet's IDs are exactly the ones the allocator chose."""
        if len(ids) != self.count or len(set(ids)) != len(ids):
            return False
        got = Counter(base_of(resource, i) for i in ids)
        if self.counts is None:
            return all(base in self.bases for base in got)
        return got == Counter(dict(self.counts))

    def choose(self, resource: str, available: list[str], must: list[str]) -> list[str] | None:
        """The IDs to prefer among `available` (keeping `must`), or None when they cannot be had."""
        pool = list(dict.fromkeys([*must, *available]))
        by_base: dict[str, list[str]] = {}
        for device_id in pool:
            by_base.setdefault(base_of(resource, device_id), []).append(device_id)
        if any(base_of(resource, m) not in self.bases for m in must):
            return None
        if self.counts is not None:
            chosen: list[str] = []
            for base, n in self.counts:
                have = by_base.get(base, [])
                if len(have) < n:
                    return None
                chosen.extend(have[:n])
            return chosen
        # Any split: round-robin over the annotated functions, `must` first.
        chosen = list(must)
        queues = [[i for i in by_base.get(b, []) if i not in chosen] for b in self.bases]
        while len(chosen) < self.count and any(queues):
            for queue in queues:
                if queue and len(chosen) < self.count:
                    chosen.append(queue.pop(0))
        return chosen if len(chosen) == self.count else None


def container_requests(pod: dict[str, Any], resource: str) -> list[tuple[str, int]]:
    """(container name, count) for every regular container requesting `resource`, in spec order."""
    spec = pod.get("spec") or {}
    for init in spec.get("initContainers") or []:
        if _request(init, resource):
            raise ExpectationError(
                f"init container {init.get('name', '')!r} requests {resource}: device resources are "
                "served to regular containers only"
            )
    out = []
    for c in spec.get("containers") or []:
        n = _request(c, resource)
        if n:
            out.append((str(c.get("name", "")), n))
    return out


def _request(container: dict[str, Any], resource: str) -> int:
    res = container.get("resources") or {}
    value = (res.get("requests") or {}).get(resource, (res.get("limits") or {}).get(resource))
    if value is None:
        return 0
    # the boundary check every entry point shares: no negative, fractional or overflowing amounts
    where = f"container {container.get('name', '')!r} {resource}"
    try:
        return resource_quantity(resource, value, where).value()
    except CodecError as exc:
        raise ExpectationError(str(exc)) from None


def _units(resource: str, entry: DeviceAllocation, where: str) -> int:
    res = entry.resources or {}
    if resource == rn.NVIDIA_GPU:
        core = res.get(rn.GPU_CORE)
        if core is not None and core.value() != 100:
            raise ExpectationError(f"{where}: nvidia.com/gpu needs whole GPUs, the entry has gpu-core {core}")
        return 1
    name = rn.RDMA if resource == rn.RDMA else rn.GPU_CORE  # a GPU share counts in gpu-core
    if name not in res:
        raise ExpectationError(f"{where}: no {name} in the entry")
    units = res[name].value()
    if units <= 0:
        raise ExpectationError(f"{where}: {name} is {res[name]}")
    return units


def _base(resource: str, entry: DeviceAllocation, inv: Inventory, where: str) -> str:
    if resource in GPU_RESOURCES:
        gpu = inv.gpu_by_minor(entry.minor)
        if gpu is None:
            raise ExpectationError(f"{where}: this node has no GPU with minor {entry.minor}")
        if entry.id and entry.id != gpu.uuid:
            raise ExpectationError(
                f"{where}: GPU {entry.minor} is {gpu.uuid} here, the annotation says {entry.id}"
            )
        return gpu.uuid
    nic = inv.nic_by_minor(entry.minor)
    if nic is None:
        raise ExpectationError(f"{where}: this node has no RDMA device with minor {entry.minor}")
    if entry.id and entry.id != nic.pf:
        raise ExpectationError(
            f"{where}: RDMA device {entry.minor} is {nic.pf} here, the annotation says {entry.id}"
        )
    for vf in entry.vfs:
        if vf.bus_id not in nic.vfs:
            raise ExpectationError(f"{where}: VF {vf.bus_id or '(no address)'} is not a VF of {nic.pf}")
    return nic.pf


def expectations(pod: dict[str, Any], resource: str, inv: Inventory) -> list[ContainerExpectation]:
    """Per container requesting `resource`, what it must get. Raises ExpectationError."""
    requests = container_requests(pod, resource)
    if not requests:
        return []
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    text = annotations.get(keys.DEVICE_ALLOCATED)
    if text is None:
        raise ExpectationError(f"no {keys.DEVICE_ALLOCATED} annotation (the pod was not placed by topoalloc)")
    try:
        allocated = parse_device_allocated(text)
    except CodecError as exc:
        raise ExpectationError(f"malformed annotation: {exc}") from None
    dtype = rn.RESOURCE_DEVICE_TYPE[resource].value
    entries = allocated[dtype]
    if not entries:
        raise ExpectationError(f"the {keys.DEVICE_ALLOCATED} annotation has no {dtype} devices")
    where = [f"{keys.DEVICE_ALLOCATED} {dtype}[{i}]" for i in range(len(entries))]
    bases = [_base(resource, e, inv, w) for e, w in zip(entries, where, strict=True)]
    if len(set(bases)) != len(bases):
        raise ExpectationError(f"the annotation names a {dtype} device twice")
    units = [_units(resource, e, w) for e, w in zip(entries, where, strict=True)]
    total = sum(n for _, n in requests)
    if resource == rn.RDMA and sum(units) != total:
        if len(requests) > 1:
            raise ExpectationError(
                f"{resource}: {len(requests)} containers request it but the annotation's units "
                f"({sum(units)}) do not add up to their requests ({total})"
            )
        name, count = requests[0]
        return [ContainerExpectation(name, count, tuple(entries), tuple(bases), None)]
    if sum(units) != total:
        raise ExpectationError(f"{resource}: the pod requests {total}, the annotation allocates {sum(units)}")
    out = []
    i = 0
    for name, count in requests:
        taken = 0
        start = i
        while taken < count and i < len(entries):
            taken += units[i]
            i += 1
        if taken != count:
            raise ExpectationError(
                f"{resource}: container {name!r} requests {count}, the annotation entries split as {units}"
            )
        counts = tuple(zip(bases[start:i], units[start:i], strict=True))
        out.append(ContainerExpectation(name, count, tuple(entries[start:i]), tuple(bases[start:i]), counts))
    return out
