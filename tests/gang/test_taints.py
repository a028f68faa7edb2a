"""Plans stay off nodes kube-scheduler would refuse the members: untolerated taints, cordons."""

from __future__ import annotations

import pytest

from allocator.runtime.taints import admits, tolerates
from tests.gang.harness import gang_world, gpu_node, member, node_of, podgroup
from tests.support.allocator_harness import double_booked
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Pki
from tests.support.polling import until

TAINT = {"key": "topoalloc.io/reserved", "value": "team-a", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("toleration", "ok"),
    [
        (
            {"key": "topoalloc.io/reserved", "operator": "Equal", "value": "team-a", "effect": "NoSchedule"},
            True,
        ),
        ({"key": "topoalloc.io/reserved", "value": "team-a"}, True),  # any effect, Equal by default
        ({"key": "topoalloc.io/reserved", "operator": "Exists"}, True),
        ({"operator": "Exists"}, True),  # tolerates everything
        ({"key": "topoalloc.io/reserved", "value": "team-b"}, False),
        ({"key": "topoalloc.io/reserved", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": "other", "operator": "Exists"}, False),
    ],
)
def test_toleration_matching(toleration: dict, ok: bool) -> None:
    assert tolerates([toleration], TAINT) is ok


def test_only_blocking_effects_and_cordons_keep_a_pod_off() -> None:
    assert admits({"taints": [{**TAINT, "effect": "PreferNoSchedule"}]}, [])
    assert not admits({"taints": [TAINT]}, [])
    assert not admits({"unschedulable": True}, [])
    cordon = {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}
    assert admits({"unschedulable": True}, [cordon])


async def test_the_planner_skips_tainted_and_cordoned_nodes(fake_api: FakeApiServer, pki: Pki) -> None:
    for name in ("a-tainted", "b-cordoned", "c-open"):
        gpu_node(fake_api, name)
    tainted = fake_api.get("nodes", "a-tainted")
    assert tainted is not None
    fake_api.put({**tainted, "spec": {"taints": [TAINT]}})
    cordoned = fake_api.get("nodes", "b-cordoned")
    assert cordoned is not None
    fake_api.put({**cordoned, "spec": {"unschedulable": True}})
    async with gang_world(fake_api, pki) as w:
        await w.admission.create_podgroup(podgroup("g", 2))
        for i in range(2):
            await w.admission.create_pod(member(f"g{i}", group="g", gpus=4))
        await until(lambda: all(node_of(p) for p in w.pods().values()), 10)
        assert {node_of(p) for p in w.pods().values()} == {"c-open"}
        # Members that tolerate the taint may go there (first by name, equally good otherwise).
        await w.admission.create_podgroup(podgroup("h", 2))
        for i in range(2):
            pod = member(f"h{i}", group="h", gpus=4)
            pod["spec"]["tolerations"] = [{"key": TAINT["key"], "operator": "Exists"}]
            await w.admission.create_pod(pod)
        await until(lambda: all(node_of(p) for p in w.pods().values()), 10)
        assert {node_of(w.pods()[f"h{i}"]) for i in range(2)} == {"a-tainted"}
        assert double_booked(w.pods().values()) == []
