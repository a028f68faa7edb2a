"""The DRA gate (allocator/claims/webhook.py): which pods it holds back at creation, read from the
cache's claims and templates; and the route over the shared admission server."""

from __future__ import annotations

from typing import Any

import pytest

from allocator.claims.webhook import claim_reviewer, gate_patch, mark_patch, reviewer
from allocator.runtime.admission import BadReview
from apis import dra
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
