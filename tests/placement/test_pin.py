"""How placement pins a pod to its node under each `placement.pin` setting."""

from __future__ import annotations

from typing import Any

from allocator.placement.writes import AFFINITY, AUTO, NOMINATE, pin_of


def pod(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "main"}], **spec}}


def test_auto_pins_by_affinity_a_pod_with_a_controller_or_a_pod_group_of_kubernetes_own() -> None:
    owned = pod()
    owned["metadata"]["ownerReferences"] = [{"kind": "Job", "name": "j", "uid": "u1", "controller": True}]
    assert pin_of(owned, AUTO) == AFFINITY
    # kube-scheduler clears a waiting member's nomination: its group's members are pinned by affinity
    assert pin_of(pod(schedulingGroup={"podGroupName": "g"}), AUTO) == AFFINITY
    assert pin_of(pod(workloadRef={"name": "w", "podGroup": "workers"}), AUTO) == AFFINITY
    assert pin_of(pod(), AUTO) == NOMINATE  # a bare pod: refused there, bound elsewhere
    not_controller = pod()
    not_controller["metadata"]["ownerReferences"] = [{"kind": "X", "name": "x", "uid": "u2"}]
    assert pin_of(not_controller, AUTO) == NOMINATE


def test_a_forced_mode_pins_every_pod_that_way() -> None:
    for mode in (AFFINITY, NOMINATE):
        assert pin_of(pod(), mode) == mode
        assert pin_of(pod(schedulingGroup={"podGroupName": "g"}), mode) == mode
