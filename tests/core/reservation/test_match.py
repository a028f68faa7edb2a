"""Which reservations a pod may use (core/reservation/match.py), and the reason when it may not."""

from __future__ import annotations

import json
from typing import Any

from allocator.core.reservation.match import mismatch, pod_side
from apis.reservation import Reservation
from apis.reservation_pod import EXACT_MATCH, RESERVATION_AFFINITY, RESERVATION_IGNORED


def res(name: str = "r", **spec: Any) -> Reservation:
    labels = spec.pop("labels", {})
    body = {
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "template": {"spec": {"containers": [{"resources": {"requests": {"nvidia.com/gpu": "2"}}}]}},
            "owners": [{"labelSelector": {"matchLabels": {"app": "a"}}}],
            **spec,
        },
        "status": {"allocatable": {"nvidia.com/gpu": "2"}},
    }
    return Reservation.from_dict(body)


def pod(gpus: int = 2, labels: dict[str, str] | None = None, **annotations: Any) -> dict[str, Any]:
    req = {"nvidia.com/gpu": str(gpus)}
    meta = {"name": "p", "namespace": "ns", "labels": {"app": "a", **(labels or {})}}
    meta["annotations"] = {k: json.dumps(v) for k, v in annotations.items()}
    return {"metadata": meta, "spec": {"containers": [{"resources": {"requests": req}}]}}


TAINT = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
AFFINITY, EXACT = RESERVATION_AFFINITY, EXACT_MATCH


def test_owners_and_the_ignored_label() -> None:
    assert mismatch(res(), pod_side(pod())) is None
    assert mismatch(res(), pod_side(pod(labels={"app": "b"}))) == "the pod is not one of its owners"
    assert "reservation-ignored" in (
        mismatch(res(), pod_side(pod(labels={RESERVATION_IGNORED: "true"}))) or ""
    )


def test_taints_bind_every_owner_and_tolerations_come_with_the_affinity() -> None:
    tainted = res(taints=[TAINT])
    assert "taint dedicated=ml:NoSchedule" in (mismatch(tainted, pod_side(pod())) or "")
    tolerant = pod(**{AFFINITY: {"tolerations": [{"key": "dedicated", "operator": "Exists"}]}})
    assert mismatch(tainted, pod_side(tolerant)) is None
    # Naming the reservation skips unschedulable, taints and selectors (Koordinator's order).
    assert (
        mismatch(res(taints=[TAINT], unschedulable=True), pod_side(pod(**{AFFINITY: {"name": "r"}}))) is None
    )
    assert "names other" in (mismatch(res(), pod_side(pod(**{AFFINITY: {"name": "other"}}))) or "")


def test_unschedulable_and_affinity_over_reservation_and_node_labels() -> None:
    assert mismatch(res(unschedulable=True), pod_side(pod())) == "it is unschedulable"
    zone = {"requiredDuringSchedulingIgnoredDuringExecution": {"reservationSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}]}}  # fmt: skip
    assert mismatch(res(), pod_side(pod(**{AFFINITY: zone})), {"zone": "z1"}) is None
    assert mismatch(res(labels={"zone": "z2"}), pod_side(pod(**{AFFINITY: zone})), {"zone": "z1"}) is not None
    by_name = {"requiredDuringSchedulingIgnoredDuringExecution": {"reservationSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["r"]}]}]}}  # fmt: skip
    assert mismatch(res(), pod_side(pod(**{AFFINITY: by_name}))) is None
    assert mismatch(res("s"), pod_side(pod(**{AFFINITY: by_name}))) is not None


def test_exact_match_and_a_bad_annotation() -> None:
    exact = {EXACT: {"resourceNames": ["nvidia.com/gpu"]}}
    assert mismatch(res(), pod_side(pod(2, **exact))) is None
    assert "exactly" in (mismatch(res(), pod_side(pod(1, **exact))) or "")
    side = pod_side({"metadata": {"labels": {"app": "a"}, "annotations": {AFFINITY: "{"}}})
    assert side.required is False and side.error and mismatch(res(), side) == side.error
