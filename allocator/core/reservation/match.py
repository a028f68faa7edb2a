"""Which reservations a pod may use (Koordinator's `checkReservationMatchedOrIgnored`), said as a
reason when it may not, for Events and `topoalloc allocate --explain`.

A pod uses a reservation when it is one of its owners and, in this order:
  * its `reservation-affinity` names the reservation (then nothing else but exact-match counts), or
  * the reservation is schedulable (or the pod's affinity tolerates `unschedulable`), every
    NoSchedule/NoExecute taint of the reservation is tolerated by the affinity's tolerations, the
    affinity's selector and terms match the reservation's labels (over its node's), and
  * `exact-match-reservation` holds for the resources it names.
A pod with a `reservation-affinity` must land in a reservation; one labelled reservation-ignored
uses none and sees every room's unallocated part as free.

Where Koordinator applies a reservation's taints only to pods that carry a reservation-affinity
(a pod without one takes a tainted reservation as if untainted, ⚠), taints here bind every owner.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from allocator.core.cluster.kube_checks import term_matches
from allocator.core.request.pod_request import SelectorTerm
from allocator.core.request.usage import effective_requests
from apis.errors import CodecError
from apis.reservation import Reservation
from apis.reservation_pod import (
    EXACT_MATCH,
    RESERVATION_AFFINITY,
    ExactMatch,
    ReservationAffinity,
    is_reservation_ignored,
    parse_exact_match,
    parse_reservation_affinity,
    untolerated,
)


@dataclass(frozen=True)
class PodSide:
    """What matching reads of a pod, parsed once."""

    meta: Mapping[str, Any]  # namespace, name, uid, labels, ownerReferences
    ignored: bool = False
    affinity: ReservationAffinity | None = None
    exact: ExactMatch = field(default_factory=ExactMatch)
    requests: Mapping[str, int] = field(default_factory=dict)  # nano-units
    error: str = ""  # a reservation annotation that does not parse

    @property
    def required(self) -> bool:
        """Must land in a reservation (it names reservations it wants)."""
        return self.affinity is not None

    @property
    def key(self) -> str:
        return f"{self.meta.get('namespace') or 'default'}/{self.meta.get('name') or ''}"


def pod_side(pod: Mapping[str, Any]) -> PodSide:
    """Never raises: a malformed annotation is `error` (the pod then fits no reservation)."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    requests: dict[str, int] = {}
    if annotations.get(EXACT_MATCH):  # only exact-match reads the requests
        try:
            requests, _, _ = effective_requests(pod.get("spec") or {})
        except CodecError:
            requests = {}
    side = PodSide(meta, is_reservation_ignored(labels), requests=requests)
    try:
        raw = annotations.get(RESERVATION_AFFINITY)
        affinity = None if raw is None else parse_reservation_affinity(raw)
        exact = parse_exact_match(annotations.get(EXACT_MATCH) or "")
    except CodecError as exc:
        return PodSide(meta, side.ignored, requests=requests, error=str(exc))
    return PodSide(meta, side.ignored, affinity, exact, requests)


def mismatch(res: Reservation, pod: PodSide, node_labels: Mapping[str, str] | None = None) -> str | None:
    """Why `pod` may not use `res` (None: it may). Availability (phase, room left, expiry) is the
    caller's; this is only who may use which."""
    if pod.error:
        return pod.error
    if pod.ignored:
        return "the pod is labelled reservation-ignored"
    if not any(o.matches(pod.meta) for o in res.owners):
        return "the pod is not one of its owners"
    affinity = pod.affinity
    if affinity is not None and affinity.name:
        if affinity.name != res.name:
            return f"the pod's reservation-affinity names {affinity.name}"
        return _exact(res, pod)
    if res.unschedulable and not (affinity is not None and affinity.tolerates_unschedulable):
        return "it is unschedulable"
    taint = untolerated(affinity.tolerations if affinity is not None else (), res.taints)
    if taint is not None:
        value = f"={taint.get('value')}" if taint.get("value") else ""
        return f"its taint {taint.get('key')}{value}:{taint.get('effect')} is not tolerated"
    if affinity is not None and not _affinity_matches(affinity, res, node_labels or {}):
        return "its labels do not match the pod's reservation-affinity"
    return _exact(res, pod)


def _exact(res: Reservation, pod: PodSide) -> str | None:
    allocatable = {n: q.nanos for n, q in res.allocatable.items()}
    if pod.exact.matches(pod.requests, allocatable):
        return None
    names = ", ".join(pod.exact.resource_names)
    return f"the pod's requests of {names} do not exactly match what it reserved"


def _affinity_matches(
    affinity: ReservationAffinity, res: Reservation, node_labels: Mapping[str, str]
) -> bool:
    labels = {**node_labels, **res.labels}
    if any(labels.get(k) != v for k, v in affinity.selector.items()):
        return False
    if affinity.terms is None:
        return True
    return any(term_matches(SelectorTerm(t.expressions, t.fields), labels, res.name) for t in affinity.terms)
