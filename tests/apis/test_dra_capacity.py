"""Consumable capacity as the allocator reads and writes it (apis/dra_capacity.py and its use in
apis/dra_slices.py and apis/dra_claims.py): a sharable device's policy, a request's
capacity.requests, a result's shareID and consumedCapacity, every malformed value named."""

from __future__ import annotations

import pytest

from apis import dra
from apis.dra_claims import ResourceClaim
from apis.dra_slices import ResourceSlice
from apis.errors import CodecError
from apis.quantity import Quantity


def slice_with(device: dict[str, object]) -> ResourceSlice:
    return ResourceSlice.from_dict(
        {
            "metadata": {"name": "s"},
            "spec": {"driver": dra.DRIVER, "pool": {"name": "n1", "generation": 1}, "devices": [device]},
        }
    )


def test_a_sharable_gpu_is_read_with_its_policies() -> None:
    gpu = {
        "name": "gpu-0",
        "allowMultipleAllocations": True,
        "capacity": dra.gpu_capacity("80Gi", sharable=True),
    }
    (dev,) = slice_with(gpu).devices
    assert dev.shared
    caps = dict(dev.capacities)
    assert caps["cores"].value == Quantity.parse("100") and caps["cores"].step == Quantity.parse("1")
    assert caps["memory"].default == Quantity.parse("80Gi") and caps["memory"].minimum == Quantity.parse(
        "1Mi"
    )
    assert dict(dev.capacity)["topoalloc.io/memory"] == 80 * 1024**3 * 1000  # milli-units, as before
    (whole,) = slice_with({"name": "gpu-1", "capacity": {"memory": {"value": "80Gi"}}}).devices
    assert not whole.shared and dict(whole.capacities)["memory"].default is None


def test_a_bad_policy_is_named() -> None:
    bad = {
        "name": "gpu-0",
        "capacity": {"cores": {"value": "100", "requestPolicy": {"validRange": {"min": "x"}}}},
    }
    with pytest.raises(CodecError, match=r"capacity\.cores\.requestPolicy\.validRange\.min"):
        slice_with(bad)
    with pytest.raises(CodecError, match="allowMultipleAllocations"):
        slice_with({"name": "gpu-0", "allowMultipleAllocations": "yes"})


def test_a_share_request_and_its_result_round_trip() -> None:
    result = {
        "request": "gpu",
        "driver": dra.DRIVER,
        "pool": "n1",
        "device": "gpu-0",
        "shareID": "8f14e45f-ceea-467f-a1d8-0e2b2f6c0c9a",
        "consumedCapacity": {"cores": "50", "memory": "40Gi"},
    }
    claim = ResourceClaim.from_dict(
        {
            "metadata": {"name": "c", "namespace": "ns"},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": dra.GPU_CLASS,
                                "capacity": {"requests": {"cores": "50", "memory": "40Gi"}},
                            },
                        }
                    ]
                }
            },
            "status": {"allocation": {"devices": {"results": [result]}}},
        }
    )
    (request,) = claim.spec.requests
    assert request.exactly is not None
    assert dict(request.exactly.capacity) == {"cores": Quantity.parse("50"), "memory": Quantity.parse("40Gi")}
    assert claim.allocation is not None
    (read,) = claim.allocation.results
    assert read.to_dict() == result
    with pytest.raises(CodecError, match=r"consumedCapacity\.cores"):
        ResourceClaim.from_dict(
            {
                "metadata": {"name": "c"},
                "status": {
                    "allocation": {
                        "devices": {"results": [{**result, "consumedCapacity": {"cores": "lots"}}]}
                    }
                },
            }
        )
