"""The allocate tests' helpers: run allocate (checking on the way that fits agrees) and unwrap its answer."""

from __future__ import annotations

from allocator.core.devices.allocate import Allocation, allocate, fits
from allocator.core.node.state import NodeState
from allocator.core.reasons import Rejection
from allocator.core.request.parse import pod_request
from allocator.core.scoring.device import DeviceScoring

MOST, LEAST = DeviceScoring("MostAllocated"), DeviceScoring("LeastAllocated")


def ok(result: Allocation | Rejection) -> Allocation:
    assert isinstance(result, Allocation), result
    return result


def rejected(result: Allocation | Rejection) -> Rejection:
    assert isinstance(result, Rejection), result
    return result


def run(state: NodeState, p: dict, **kwargs) -> Allocation | Rejection:
    """allocate, checking on the way that fits agrees with it."""
    req = pod_request(p)
    result = allocate(state, req, **kwargs)
    verdict = fits(state, req)
    if "scoring" not in kwargs and "numa_mask" not in kwargs and "required" not in kwargs:
        assert verdict == (result if isinstance(result, Rejection) else None)
    return result
