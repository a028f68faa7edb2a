"""Koordinator's own reservation test cases for device allocation, converted and run on the core.

Source: koordinator-sh/koordinator, pkg/scheduler/plugins/deviceshare/reservation_test.go
(`Test_tryAllocateFromReservation`, `Test_allocateWithNominated`, `Test_Plugin_ReservationRestore`).
Their node: two healthy GPUs (minors 0 and 1), each 100 gpu-core, 100 gpu-memory-ratio, 8Gi.

How a case maps: Koordinator's node cache counts the reserve pod at the room's full size *and*
its owners, so the device share free for an owner is `total - (used - allocated - remained)`
(protocol 5, preemptible). The core counts each room once, at what is left, beside every pod; so
the node here holds a pod with `used - allocated - remained` per GPU (clamped at zero, as
Koordinator clamps) and the room's entry with `remained`. Every share below is in percent of one
GPU (core, ratio and memory alike, as in every one of their cases).

Converted (15 of Koordinator's cases, 14 tests, all passing): 12 of the 13
`tryAllocateFromReservation` cases, 2 of the 3 `allocateWithNominated` cases (the
reservation-ignored pod; the normal pod without a reservation is the same plain choice as "no
matched reservations" and shares its test) and the restore case. Left out: everything about
pre-allocation (the "pre-allocatable pod" case, `Test_Plugin_RestoreReservationPreAllocation`,
`Test_isDeviceAllocationsInclude`), which topoalloc does not serve (docs/compatibility.md R6), and
"reserve pod without pre-allocation": topoalloc places a Reservation itself, so no reserve pod
goes through the allocation (R1). Failures compare Koordinator's reason string with the
rejection's `code` (the message is topoalloc's own sentence).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from allocator.core.devices.allocate import Allocation, allocate
from allocator.core.node.inventory import build_inventory
from allocator.core.node.state import NodeState
from allocator.core.reasons import Rejection
from allocator.core.request.parse import pod_request
from allocator.core.reservation.consume import allocate_from_room, allocate_ignoring
from allocator.core.reservation.room import Room, remaining, room_key
from apis.annotations import DeviceAllocations
from tests.core.nodes import CORE, MEM, RATIO
from tests.core.pods import pod
from tests.support.allocations import entry

GIB = 2**30
Shares = dict[int, int]  # GPU minor -> percent of the GPU


def device() -> dict:
    gpu = {CORE: "100", MEM: "8Gi", RATIO: "100"}
    devices = [{"type": "gpu", "minor": m, "health": True, "resources": dict(gpu)} for m in (0, 1)]
    return {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Device",
        "metadata": {"name": "test-node"},
        "spec": {"devices": devices},
    }


def allocations(shares: Shares) -> DeviceAllocations:
    return DeviceAllocations(
        {"gpu": [entry(m, {CORE: p, RATIO: p, MEM: 8 * GIB * p // 100}) for m, p in sorted(shares.items())]}
    )


@dataclass
class Case:
    name: str
    policy: str  # "" (Default), Aligned, Restricted
    allocatable: Shares
    allocated: Shares
    remained: Shares
    used: Shares  # Koordinator's deviceUsed
    want: int | None  # the GPU minor chosen, None for a failure
    request: tuple[int, int] = (50, 4)  # gpu-core percent, gpu-memory GiB
    ignored: bool = False
    message: str = ""  # the failure as Koordinator reports it
    notes: list[str] = field(default_factory=list)


HALF, QUARTER, THREE_QUARTERS = {0: 50}, {0: 25}, {0: 75}
BOTH, QUARTER_AND_ONE = {0: 100, 1: 100}, {0: 25, 1: 100}

CASES = [
    Case("allocate from default policy reservation", "", QUARTER, {}, QUARTER, {}, 0),
    Case("allocate from default policy reservation and required from reservation", "", HALF, QUARTER, HALF, {0: 50}, 0),
    Case(
        "allocate from default policy reservation and required from reservation and reservation empty",
        "", HALF, HALF, {}, {0: 150}, 1,
    ),
    Case("allocate from Aligned policy reservation", "Aligned", HALF, {}, HALF, {0: 100, 1: 100}, 0),
    Case(
        "failed to allocate from Aligned policy reservation with bigger request but no remaining resources on node",
        "Aligned", HALF, {}, HALF, {0: 100, 1: 100}, None, request=(60, 5),
        message="Reservation(s) Insufficient gpu devices",
    ),
    Case(
        "failed to allocate from Aligned policy reservation that remaining little not fits request",
        "Aligned", HALF, QUARTER, QUARTER, {0: 125, 1: 100}, None, request=(30, 1),
        message="Reservation(s) Insufficient gpu devices",
    ),
    Case("allocate from Restricted policy reservation", "Restricted", HALF, {}, HALF, {0: 100, 1: 100}, 0),
    Case(
        "failed to allocate from Restricted policy reservation since node remains resources but reservation not fits",
        "Restricted", HALF, QUARTER, QUARTER, {0: 75, 1: 100}, None,
        message="Reservation(s) Insufficient gpu devices",
    ),
    Case(
        "allocate from Restricted policy reservation with reservation-ignored pods",
        "Restricted", BOTH, {}, BOTH, {0: 175, 1: 150}, 1,
    ),
    Case(
        "allocate with a reservation-ignored pod", "Restricted", BOTH, THREE_QUARTERS, QUARTER_AND_ONE,
        {0: 175, 1: 100}, 1, ignored=True,
    ),
    Case(
        "failed to allocate with a reservation-ignored pod", "Restricted", BOTH, BOTH, {}, {0: 200, 1: 200},
        None, ignored=True, message="Insufficient gpu devices",
    ),
    # Test_allocateWithNominated: a reservation-ignored pod beside a half-GPU room succeeds.
    Case("allocateWithNominated: reservation-ignored pod", "", HALF, {}, HALF, {0: 50}, 0, ignored=True),
]  # fmt: skip


def node_and_room(case: Case) -> tuple[NodeState, Room]:
    state = NodeState("test-node", build_inventory(device(), {}), {})
    others = {
        m: max(0, case.used.get(m, 0) - case.allocated.get(m, 0) - case.remained.get(m, 0)) for m in (0, 1)
    }
    others = {m: p for m, p in others.items() if p}
    if others:
        state.add_pod("default/others", allocations(others))
    room = Room(
        "r",
        "test-node",
        allocations(case.allocatable),
        allocations(case.remained),
        case.policy == "Restricted",
    )
    if room.remaining:
        state.add_pod(room_key("r"), room.remaining)
    return state, room


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_koordinator_case(case: Case) -> None:
    state, room = node_and_room(case)
    core, gib = case.request
    req = pod_request(pod({CORE: str(core), MEM: f"{gib}Gi"}))
    got = allocate_ignoring(state, req, [room.key]) if case.ignored else allocate_from_room(state, req, room)
    if case.want is None:
        assert isinstance(got, Rejection), got
        assert got.code == case.message
        return
    assert isinstance(got, Allocation), got
    [gpu] = got.devices["gpu"]
    assert gpu.minor == case.want
    assert {n: q.value() for n, q in (gpu.resources or {}).items()} == {
        CORE: core,
        MEM: gib * GIB,
        RATIO: gib * 100 // 8,
    }


def test_no_matched_reservation_is_the_node_choice() -> None:
    """ "no matched reservations": Koordinator leaves the pod to the normal allocation; so does the
    allocator (no room, no bound): the node's own choice, the room counted as used."""
    state, _ = node_and_room(Case("", "", HALF, {}, HALF, {0: 100}, None))
    got = allocate(state, pod_request(pod({CORE: "50", MEM: "4Gi"})))
    assert isinstance(got, Allocation) and got.minors("gpu") == [1]


def test_restore_what_is_left_of_a_room() -> None:
    """Test_Plugin_ReservationRestore: a whole GPU 1 reserved, an owner took half of it; what is
    left is the other half (core, memory and ratio)."""
    reserved = DeviceAllocations({"gpu": [entry(1, {CORE: 100, MEM: 8 * GIB, RATIO: 100})]})
    taken = DeviceAllocations({"gpu": [entry(1, {CORE: 50, MEM: 4 * GIB, RATIO: 50})]})
    [left] = remaining(reserved, [taken])["gpu"]
    assert left.minor == 1
    assert {n: q.value() for n, q in (left.resources or {}).items()} == {CORE: 50, MEM: 4 * GIB, RATIO: 50}
