"""Whole-GPU choice by interconnect on nodes where NVLink differs between GPU pairs: the pod's
request and the node's state turned into a `SetRequest`, the chooser's answer turned into picks
and explanation lines (`topoalloc allocate --explain` prints them)."""

from __future__ import annotations

from allocator.core.devices.context import Ctx, Pick, minor_list
from allocator.core.devices.gpu_sets import Choice, SetRequest, choose
from allocator.core.node.gpu_summary import GPUSummary
from allocator.core.request.pod_request import GPURequirement
from apis import resources as rn

GPU, RDMA = rn.DeviceType.GPU, rn.DeviceType.RDMA


def set_request(ctx: Ctx, g: GPURequirement, feasible: int, used: int, level: int) -> SetRequest:
    inv = ctx.inv
    within = None
    if level:
        by_level = inv.scopes_by_level
        within = tuple(s.mask for lvl in sorted(by_level) if lvl >= level for s in by_level[lvl])
    scopes = tuple(s.mask for s in inv.tree.walk()) if inv.tree is not None else ()
    return SetRequest(
        count=g.count,
        candidates=feasible,
        pool=GPUSummary.of(ctx.state).whole_mask,
        used=used,
        within=within,
        scopes=scopes,
        nic_ok=_gpus_with_free_nic(ctx),
    )


def _gpus_with_free_nic(ctx: Ctx) -> int | None:
    """For a joint pod whose GPUs are chosen first and that also wants RDMA: the GPUs behind a
    PCIe switch that has a NIC with something free. None when the pod asks no such thing."""
    joint = ctx.req.joint_types
    if not joint or joint[0] != GPU or RDMA not in joint or RDMA not in ctx.per_type:
        return None
    inv = ctx.inv
    scopes = set()
    for minor, free in ctx.view.free.get(RDMA, {}).items():
        slot = inv.slot(RDMA, minor)
        if slot is not None and slot.total and any(free.values()):
            scopes.add(slot.pcie_scope)
    mask = 0
    for slot in inv.slots(GPU):
        if slot.pcie_scope in scopes:
            mask |= slot.bit
    return mask


def pick_gpu_set(ctx: Ctx, g: GPURequirement, feasible: int, used: int, level: int) -> list[Pick] | None:
    """The chooser's set as picks, or None when no set of the request's size qualifies."""
    inv = ctx.inv
    assert inv.interconnect is not None
    choice = choose(inv.interconnect, set_request(ctx, g, feasible, used, level))
    if choice is None:
        return None
    _explain(ctx, choice)
    return [Pick(m, g.per_gpu) for m in choice.minors]


def _explain(ctx: Ctx, choice: Choice) -> None:
    if ctx.notes is None:
        return
    how = "every set compared" if choice.exact else "bounded search"
    ctx.note(f"GPU sets by interconnect ({how}), best first:")
    for minors, objective in choice.ranked:
        ctx.note(f"  GPUs {minor_list(minors)}: {objective.terms()}")
    ctx.note(f"GPUs {minor_list(choice.minors)} chosen by interconnect")
