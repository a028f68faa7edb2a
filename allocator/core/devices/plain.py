"""Per-device selection (protocol 8.4): devices ranked by device score (the primary type's PCIe
scopes first, round-robin, in joint allocations), each with the lowest free matching VF."""

from __future__ import annotations

from collections.abc import Collection

from allocator.core import reasons as rs
from allocator.core.devices.context import Ctx, Pick, device_score, noun
from allocator.core.devices.handler import UNDECIDED, Undecided
from allocator.core.devices.messages import (
    type_shortage,
)
from allocator.core.node.features import Feature
from allocator.core.node.inventory import VF, DeviceSlot, NodeInventory
from allocator.core.node.state import NodeState
from allocator.core.node.summary import all_zero, fits_free
from allocator.core.reasons import Rejection
from allocator.core.request.pod_request import PodRequest, Resources
from apis import resources as rn
from apis.quantity import Format, Quantity
from apis.selector import LabelSelector

GPU = rn.DeviceType.GPU


def select_plain(
    ctx: Ctx, dtype: str, per: Resources, desired: int, max_count: int, pcies: frozenset[str]
) -> list[Pick] | Rejection:
    inv = ctx.inv
    frees = ctx.view.free.get(dtype, {})
    hint = ctx.req.hint(dtype)
    vf_selector = hint.vf_selector if hint is not None else None
    if ctx.scoring is None:
        ranked = [(0, m) for m in sorted(frees)]
    else:
        ranked = sorted(((device_score(ctx, dtype, per, m), m) for m in frees), key=lambda t: (-t[0], t[1]))
    if pcies and dtype != GPU:
        ranked = _round_robin(inv, dtype, ranked, pcies)
    picks: list[Pick] = []
    taken_vfs = ctx.state.vf_taken.get(dtype, {})
    for score, minor in ranked:
        free = frees[minor]
        if all_zero(free) or not fits_free(per, free):
            continue
        vf = None
        if vf_selector is not None:
            slot = inv.slot(dtype, minor)
            vf = None if slot is None else _lowest_free_vf(slot, vf_selector, taken_vfs.get(minor, ()))
            if vf is None:
                continue
        picks.append(Pick(minor, per, vf))
        if ctx.notes is not None:
            ctx.note(f"{dtype} {minor}: device score {score}" + (f", VF {vf.bus_id}" if vf else ""))
        if len(picks) == max_count:
            break
    if len(picks) < desired:
        if dtype == GPU:
            return Rejection(rs.INSUFFICIENT_DEVICES.format(type=dtype), "")
        return type_shortage(dtype, desired, len(picks), vf=vf_selector is not None, hint=hint)
    return picks


def _round_robin(
    inv: NodeInventory, dtype: str, ranked: list[tuple[int, int]], pcies: frozenset[str]
) -> list[tuple[int, int]]:
    """Preferred PCIe scopes first, one device of each per round (each round by score, then minor)."""
    groups: dict[str, list[tuple[int, int]]] = {}
    rest = []
    for item in ranked:
        slot = inv.slot(dtype, item[1])
        if slot is not None and slot.has_topology and slot.pcie_scope in pcies:
            groups.setdefault(slot.pcie_scope, []).append(item)
        else:
            rest.append(item)
    ordered = []
    depth = max((len(v) for v in groups.values()), default=0)
    for i in range(depth):
        ordered.extend(sorted((v[i] for v in groups.values() if i < len(v)), key=lambda t: (-t[0], t[1])))
    return ordered + rest


def _lowest_free_vf(slot: DeviceSlot, selector: LabelSelector, taken: Collection[str]) -> VF | None:
    """The free VF with the lowest busID among the groups the selector matches."""
    groups = slot.vf_groups
    matches: dict[int, bool] = {}
    for vf in slot.vfs_by_bus:
        if vf.bus_id in taken:
            continue
        ok = matches.get(vf.group)
        if ok is None:
            ok = matches[vf.group] = selector.matches(groups[vf.group][0])
        if ok:
            return vf
    return None


def pcie_scopes(inv: NodeInventory, dtype: str, picks: list[Pick]) -> frozenset[str]:
    """The PCIe scopes of the chosen devices that have topology."""
    out = set()
    for p in picks:
        slot = inv.slot(dtype, p.minor)
        if slot is not None and slot.has_topology:
            out.add(slot.pcie_scope)
    return frozenset(out)


class PerDeviceHandler:
    """Device types chosen device by device (RDMA NICs, FPGAs): `resource` counts percent of a
    device (100 = one whole device) unless a hint says otherwise."""

    verdict_without_picks = False

    def __init__(self, dtype: str, resource: str) -> None:
        self.dtype, self.resource = dtype, resource

    def admit(self, state: NodeState, req: PodRequest) -> Rejection | None:
        return None

    def quick_verdict(self, state: NodeState, req: PodRequest) -> Rejection | Undecided | None:
        return UNDECIDED

    def grouping(self, req: PodRequest) -> Feature | None:
        return None

    def demand(self, ctx: Ctx, resources: Resources) -> tuple[Resources, int] | Rejection:
        dtype, name = self.dtype, self.resource
        q = dict(resources).get(name, 0)
        hint = ctx.req.hint(dtype)
        count, per = 1, resources
        if q > 100 and q % 100 == 0:
            count, per = q // 100, ((name, 100),)
        elif hint is not None and hint.allocate_strategy == "ApplyForAll":
            slots = ctx.inv.slots(dtype)
            if hint.selector is not None:
                slots = tuple(s for s in slots if hint.selector.matches(s.labels))
            count = len(slots)
            if count == 0:
                return Rejection(
                    rs.INSUFFICIENT_DEVICES.format(type=dtype),
                    f"no {noun(dtype)} on the node matches the selector",
                    True,
                )
        elif hint is not None and hint.allocate_strategy == "RequestsAsCount":
            count = q
            per = ((name, 100 if hint.exclusive_policy == "DeviceLevel" else 1),)
        return per, count

    def choose(
        self, ctx: Ctx, per: Resources, desired: int, pcies: frozenset[str], *, need_picks: bool
    ) -> tuple[list[Pick], str] | Rejection:
        if ctx.req.joint_same_pcie and desired < len(pcies):
            desired = len(pcies)  # SamePCIe: one on each of the primary's switches
        max_count = max(desired, len(pcies))
        picks = select_plain(ctx, self.dtype, per, desired, max_count, pcies)
        if isinstance(picks, Rejection):
            return picks
        return picks, ""

    def joint_scopes(self, inv: NodeInventory, picks: list[Pick]) -> frozenset[str]:
        return pcie_scopes(inv, self.dtype, picks)

    def resources(self, chosen: dict[str, int], slot: DeviceSlot | None) -> dict[str, Quantity]:
        return {n: Quantity.of(v, Format.DECIMAL_SI) for n, v in chosen.items()}
