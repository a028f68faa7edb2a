"""What one allocation call works on: the candidate devices with their free resources (protocol
8.1), the request, the device scorer and the explanation being written; plus small helpers."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from allocator.core.node.gpu_summary import GPUSummary
from allocator.core.node.inventory import VF, NodeInventory
from allocator.core.node.state import NodeState
from allocator.core.node.summary import all_zero, fits_free
from allocator.core.request.pod_request import GPURequirement, PodRequest, Resources
from allocator.core.scoring.device import DeviceScoring
from apis import resources as rn

GPU, RDMA, FPGA = rn.DeviceType.GPU, rn.DeviceType.RDMA, rn.DeviceType.FPGA

Bounds = Mapping[str, Mapping[int, Mapping[str, int]]]


@dataclass(frozen=True, slots=True)
class Pick:
    minor: int
    resources: Resources
    vf: VF | None = None


@dataclass
class Ctx:
    state: NodeState
    inv: NodeInventory
    req: PodRequest
    scoring: DeviceScoring | None
    view: View
    notes: list[str] | None
    per_type: dict[str, tuple[Resources, int]] = field(default_factory=dict)  # request per device, count
    prefer: tuple[int, ...] = ()  # GPUs the node score assumed for a shared pod

    def note(self, text: str) -> None:
        if self.notes is not None:
            self.notes.append(text)


class View:
    """Candidate devices per type with their free resources (protocol 8.1).

    Without a NUMA mask, bounds or selectors this is the node state itself, copied nothing.
    """

    def __init__(self, state: NodeState, req: PodRequest, numa: frozenset[int] | None, bounds: Bounds | None):
        self.state = state
        inv = state.inventory
        assert inv is not None
        self.filtered = numa is not None or bounds is not None or req.has_selectors
        self.free: dict[str, dict[int, dict[str, int]]] = {}
        self.cut_mask = 0  # GPUs whose free a bound cut below what is really free
        for dtype, _ in req.devices:
            if not self.filtered:
                self.free[dtype] = state.free.get(dtype, {})
                continue
            hint = req.hint(dtype)
            selector = hint.selector if hint is not None else None
            frees: dict[int, dict[str, int]] = {}
            bound = None if bounds is None else bounds.get(dtype, {})
            for slot in inv.slots(dtype):
                if numa is not None and (not slot.has_topology or (slot.numa >= 0 and slot.numa not in numa)):
                    continue
                if selector is not None and not selector.matches(slot.labels):
                    continue
                free = state.free.get(dtype, {}).get(slot.minor, {})
                if bound is not None:
                    if slot.minor not in bound:
                        continue
                    cut = {n: min(v, bound[slot.minor][n]) for n, v in free.items() if n in bound[slot.minor]}
                    if cut != free and dtype == GPU:
                        self.cut_mask |= 1 << slot.minor
                    free = cut
                frees.setdefault(slot.minor, free)
            if frees and not all(all_zero(f) for f in frees.values()):
                self.free[dtype] = frees
        self.pcie_exclusive: set[str] = set()
        for dtype, _ in req.devices:
            hint = req.hint(dtype)
            if hint is not None and hint.pcie_exclusive and dtype in self.free:
                self._keep_idle_pcie(dtype)

    def _keep_idle_pcie(self, dtype: str) -> None:
        """exclusivePolicy PCIeLevel: only PCIe scopes none of whose devices of this type is in use."""
        inv = self.state.inventory
        assert inv is not None
        used = self.state.used.get(dtype, {})
        busy = {s.pcie_scope for s in inv.slots(dtype) if any(used.get(s.minor, {}).values())}
        keep = {}
        for minor, free in self.free[dtype].items():
            slot = inv.slot(dtype, minor)
            if slot is not None and slot.has_topology and slot.pcie_scope not in busy:
                keep[minor] = free
        self.free[dtype] = keep
        self.filtered = True

    def gpu_masks(self, g: GPURequirement) -> tuple[int, int, int]:
        """(feasible, in view and healthy, in use) GPU bitmasks."""
        state = self.state
        inv = state.inventory
        assert inv is not None
        gpus = GPUSummary.of(state)
        used = gpus.used_mask | self.cut_mask
        if not self.filtered:
            return gpus.fit_mask(g.per_gpu), inv.gpu_healthy_mask, used
        feasible = total = 0
        for minor, free in self.free.get(GPU, {}).items():
            if not (inv.gpu_healthy_mask >> minor & 1):
                continue
            total |= 1 << minor
            if free and not all_zero(free) and fits_free(g.per_gpu, free):
                feasible |= 1 << minor
        return feasible, total, used


def device_score(ctx: Ctx, dtype: str, per: Resources, minor: int) -> int:
    if ctx.scoring is None:
        return 0
    slot = ctx.inv.slot(dtype, minor)
    total = slot.total if slot is not None else {}
    free = ctx.view.free.get(dtype, {}).get(minor, {})
    return ctx.scoring.score_device(dict(per), total, free)


_NOUNS = {GPU: ("GPU", "GPUs"), RDMA: ("RDMA NIC", "RDMA NICs"), FPGA: ("FPGA", "FPGAs")}


def noun(dtype: str, count: int = 1) -> str:
    one, many = _NOUNS.get(dtype, (dtype, dtype + "s"))
    return one if count == 1 else many


def minor_list(minors: Iterable[int]) -> str:
    return ", ".join(str(m) for m in minors)
