"""The DRA gate (allocator/claims/webhook.py): which pods it holds back at creation, read from the
cache's claims and templates; and the route over the shared admission server."""

from __future__ import annotations

from typing import Any

import pytest

from allocator.claims.webhook import claim_reviewer, gate_patch, mark_patch, reviewer
from allocator.core.claims.published import NodeDevices, pool_devices
from allocator.runtime.admission import BadReview
from apis import dra
from apis.dra_slices import ResourceSlice
from tests.claims.fakes import FakeClaimsCache
from tests.claims.objects import claim, claim_pod, gpus, template

OPT_OUT = {dra.ALLOCATOR_ANNOTATION: dra.ALLOCATOR_KUBE_SCHEDULER}


def cache() -> FakeClaimsCache:
    c = FakeClaimsCache()
    c.add_template(template("ours", gpus(2)))
    c.add_template(template("opted-out", gpus(1), annotations=OPT_OUT))
    c.add_template(
        template("nvidia", {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]})
    )
    c.add_template(
        template(
            "refused",
            {
                "requests": [
                    {
                        "name": "g",
                        "exactly": {
                            "deviceClassName": dra.GPU_CLASS,
                            "capacity": {"requests": {"memory": "1Gi"}},
                        },
                    }
                ]
            },
        )
    )
    c.add_claim(claim("free", gpus(1)))
    allocated = claim("taken", gpus(1))
    allocated["status"] = {"allocation": {"devices": {"results": []}}}
    c.add_claim(allocated)
    return c


GATE = [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": dra.SCHEDULING_GATE}]}]


@pytest.mark.parametrize(
    ("refs", "gated"),
    [
        ({"templates": {"g": "ours"}}, True),
        ({"templates": {"g": "refused"}}, True),  # held with its reason rather than first fit
        ({"templates": {"g": "opted-out"}}, False),
        ({"templates": {"g": "nvidia"}}, False),
        ({"templates": {"g": "unknown"}}, False),
        ({"claims": {"g": "free"}}, True),
        ({"claims": {"g": "taken"}}, False),  # allocated: kube-scheduler follows its node selector
        ({"templates": {"a": "nvidia", "b": "ours"}}, True),
    ],
)
def test_which_pods_are_gated(refs: dict[str, Any], gated: bool) -> None:
    got = gate_patch(claim_pod("p", **refs), cache().dra)
    assert (got == GATE) is gated and (got is None) is (not gated)


def test_pods_the_gate_leaves_alone() -> None:
    view = cache().dra
    bound = claim_pod("p", templates={"g": "ours"})
    bound["spec"]["nodeName"] = "n1"
    assert gate_patch(bound, view) is None
    other = claim_pod("p", templates={"g": "ours"})
    other["spec"]["schedulerName"] = "my-scheduler"
    assert gate_patch(other, view, ["default-scheduler"]) is None
    # Already gated by the gang webhook: the DRA gate goes after it.
    both = claim_pod("p", templates={"g": "ours"})
    both["spec"]["schedulingGates"] = [{"name": "topoalloc.io/gang"}]
    assert gate_patch(both, view) == [
        {"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": dra.SCHEDULING_GATE}}
    ]
    both["spec"]["schedulingGates"].append({"name": dra.SCHEDULING_GATE})
    assert gate_patch(both, view) is None
    with pytest.raises(BadReview):
        gate_patch({"metadata": {}, "spec": []}, view)


def test_nothing_is_gated_before_the_cache_has_synced() -> None:
    view = cache().dra
    request = {
        "uid": "u",
        "kind": {"kind": "Pod"},
        "operation": "CREATE",
        "object": claim_pod("p", templates={"g": "ours"}),
    }
    assert reviewer(view, lambda: False)(request) == {"uid": "u", "allowed": True}
    answer = reviewer(view, lambda: True)(request)
    assert answer["allowed"] and answer["patchType"] == "JSONPatch"


def test_a_claim_topoalloc_allocates_is_marked_at_creation_and_no_other() -> None:
    mark = {"op": "add", "path": "/metadata/annotations", "value": {dra.ALLOCATED_BY_ANNOTATION: "topoalloc"}}
    bare = claim("c", gpus(2))
    del bare["metadata"]["annotations"]
    assert mark_patch(bare) == [mark]
    key = "topoalloc.io~1allocated-by"
    keyed = claim("c", gpus(1), annotations={"team": "a"})
    assert mark_patch(keyed) == [{"op": "add", "path": f"/metadata/annotations/{key}", "value": "topoalloc"}]
    assert mark_patch(claim("c", gpus(1), annotations=OPT_OUT)) is None  # kube-scheduler's
    nvidia = {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}
    assert mark_patch(claim("c", nvidia)) is None
    marked = claim("c", gpus(1), annotations={dra.ALLOCATED_BY_ANNOTATION: dra.ALLOCATED_BY})
    assert mark_patch(marked) is None
    review = claim_reviewer()
    request = {"uid": "u1", "operation": "CREATE", "kind": {"kind": "ResourceClaim"}, "object": bare}
    answer = review(request)
    assert answer["allowed"] and answer["patchType"] == "JSONPatch"
    assert review({**request, "kind": {"kind": "Pod"}}) == {"uid": "u1", "allowed": True}


def test_a_share_is_refused_at_creation_where_the_clusters_gpus_are_whole_only() -> None:
    """An API server that drops consumable capacity (before 1.36) would store the claim or template
    without capacity.requests, after admission: it is refused while no node publishes a sharable
    GPU, and allowed once one does (or while nothing is published yet)."""
    c = cache()
    review = claim_reviewer(c.dra)
    asks = {
        "requests": [
            {
                "name": "g",
                "exactly": {"deviceClassName": dra.GPU_CLASS, "capacity": {"requests": {"cores": "50"}}},
            }
        ]
    }

    def answer(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        return review({"uid": "u1", "operation": "CREATE", "kind": {"kind": kind}, "object": obj})

    share_claim, share_template = claim("c", asks), template("t", asks)
    assert answer("ResourceClaim", share_claim)["allowed"]  # nothing published yet: fails open
    c.dra.published["n1"] = pool({"name": "gpu-0"})
    for kind, obj in (("ResourceClaim", share_claim), ("ResourceClaimTemplate", share_template)):
        refused = answer(kind, obj)
        assert not refused["allowed"] and "whole only" in refused["status"]["message"], kind
    assert answer("ResourceClaim", claim("w", gpus(1)))["allowed"]  # a whole GPU is fine
    assert answer("ResourceClaimTemplate", template("w", gpus(1))) == {"uid": "u1", "allowed": True}
    c.dra.published["n2"] = pool({"name": "gpu-0", "allowMultipleAllocations": True}, "n2")
    assert answer("ResourceClaimTemplate", share_template) == {"uid": "u1", "allowed": True}
    assert answer("ResourceClaim", share_claim)["patchType"] == "JSONPatch"  # marked as ours


def pool(device: dict[str, Any], node: str = "n1") -> NodeDevices:
    obj = {
        "metadata": {"name": f"{node}-slice"},
        "spec": {
            "driver": dra.DRIVER,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "nodeName": node,
            "devices": [device],
        },
    }
    found = pool_devices(node, [ResourceSlice.from_dict(obj)])
    assert found is not None
    return found
