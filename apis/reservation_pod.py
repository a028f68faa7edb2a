"""The pod side of Koordinator's Reservation protocol (`apis/extension/reservation.go`): which
reservation a pod was allocated from, which reservations it may use, and the label that makes it
look past reservations. Each `parse_*` raises CodecError naming the annotation and the field;
`to_json` writes what Go's encoding/json writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from apis import decode as d
from apis import gojson, keys
from apis.errors import CodecError
from apis.tolerations import tolerates

RESERVATION_ALLOCATED = keys.SCHED + "reservation-allocated"
RESERVATION_AFFINITY = keys.SCHED + "reservation-affinity"
EXACT_MATCH = keys.SCHED + "exact-match-reservation"
RESERVATION_IGNORED = keys.SCHED + "reservation-ignored"  # a label, "true"
RESERVATION_ORDER = keys.SCHED + "reservation-order"  # a Reservation label: lower is used first
# Koordinator's NUMA record: the NUMA node whose cpu and memory go with a room's devices (on the
# Reservation, and on each owner bound from it).
RESOURCE_STATUS = keys.SCHED + "resource-status"

UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
_BLOCKING = ("NoSchedule", "NoExecute")
_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")

# (key, operator, values): one requirement of a selector term, as the core's SelectorTerm keeps it.
Requirement = tuple[str, str, tuple[str, ...]]


@dataclass(frozen=True)
class ReservationAllocated:
    """`reservation-allocated`: the Reservation a pod's resources came from."""

    name: str = ""
    uid: str = ""

    def to_json(self) -> str:
        out = {}
        if self.name:
            out["name"] = self.name
        if self.uid:
            out["uid"] = self.uid
        return gojson.dumps(out)


def parse_reservation_allocated(text: str) -> ReservationAllocated:
    data = d.struct(gojson.loads(text, RESERVATION_ALLOCATED), RESERVATION_ALLOCATED, ("name", "uid"))
    return ReservationAllocated(
        d.string(data, "name", RESERVATION_ALLOCATED), d.string(data, "uid", RESERVATION_ALLOCATED)
    )


@dataclass(frozen=True)
class Term:
    """One reservationSelectorTerm (a NodeSelectorTerm over the Reservation's labels, with the
    node's labels beneath them, and `metadata.name` as the Reservation's name)."""

    expressions: tuple[Requirement, ...] = ()
    fields: tuple[Requirement, ...] = ()


@dataclass(frozen=True)
class ReservationAffinity:
    """`reservation-affinity`: the reservations a pod must be placed in. A pod that carries it is
    placed in a matching reservation or not at all."""

    name: str = ""
    terms: tuple[Term, ...] | None = None  # None: no required terms
    selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()

    def tolerates_all(self, taints: tuple[Mapping[str, Any], ...]) -> Mapping[str, Any] | None:
        """The first NoSchedule/NoExecute taint of a reservation these tolerations do not
        tolerate; None when they tolerate them all."""
        return untolerated(self.tolerations, taints)

    @property
    def tolerates_unschedulable(self) -> bool:
        return tolerates(self.tolerations, UNSCHEDULABLE_TAINT)


def untolerated(
    tolerations: tuple[Mapping[str, Any], ...], taints: tuple[Mapping[str, Any], ...]
) -> Mapping[str, Any] | None:
    for taint in taints:
        if taint.get("effect") in _BLOCKING and not tolerates(tolerations, taint):  # type: ignore[arg-type]
            return taint
    return None


def parse_reservation_affinity(text: str) -> ReservationAffinity:
    where = RESERVATION_AFFINITY
    if not text:
        return ReservationAffinity()
    fields = ("name", "requiredDuringSchedulingIgnoredDuringExecution", "reservationSelector", "tolerations")
    data = d.struct(gojson.loads(text, where), where, fields)
    terms: tuple[Term, ...] | None = None
    required = data.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is not None:
        rpath = d.join(where, "requiredDuringSchedulingIgnoredDuringExecution")
        rdata = d.struct(required, rpath, ("reservationSelectorTerms",))
        tpath = d.join(rpath, "reservationSelectorTerms")
        terms = tuple(
            _term(t, d.join(tpath, i))
            for i, t in enumerate(d.array(rdata, "reservationSelectorTerms", rpath))
        )
    tolerations = []
    for i, t in enumerate(d.array(data, "tolerations", where)):
        tpath = d.join(d.join(where, "tolerations"), i)
        tdata = d.struct(t, tpath, ("key", "operator", "value", "effect", "tolerationSeconds"))
        op = d.string(tdata, "operator", tpath) or "Equal"
        d.one_of(op, ("Equal", "Exists"), d.join(tpath, "operator"))
        tolerations.append(
            {"key": d.string(tdata, "key", tpath), "operator": op, "value": d.string(tdata, "value", tpath)}
            | {"effect": d.string(tdata, "effect", tpath)}
        )
    return ReservationAffinity(
        name=d.string(data, "name", where),
        terms=terms,
        selector=d.str_map(data, "reservationSelector", where),
        tolerations=tuple(tolerations),
    )


def _term(value: Any, path: str) -> Term:
    data = d.struct(value, path, ("matchExpressions", "matchFields"))
    return Term(_requirements(data, "matchExpressions", path), _requirements(data, "matchFields", path))


def _requirements(data: Mapping[str, Any], name: str, path: str) -> tuple[Requirement, ...]:
    out = []
    for i, item in enumerate(d.array(data, name, path)):
        rpath = d.join(d.join(path, name), i)
        r = d.struct(item, rpath, ("key", "operator", "values"))
        values = d.array(r, "values", rpath)
        if not all(isinstance(v, str) for v in values):
            raise CodecError(d.join(rpath, "values"), "expected a list of strings", values)
        op = d.one_of(d.string(r, "operator", rpath, required=True), _OPERATORS, d.join(rpath, "operator"))
        out.append((d.string(r, "key", rpath, required=True), op, tuple(values)))
    return tuple(out)


@dataclass(frozen=True)
class ExactMatch:
    """`exact-match-reservation`: for each named resource, the pod's request must equal the
    reservation's allocatable (both absent is a match for that name). Amounts in any one unit
    (nano-units, Quantities), the same on both sides."""

    resource_names: tuple[str, ...] = ()

    def matches(self, requests: Mapping[str, object], allocatable: Mapping[str, object]) -> bool:
        for name in self.resource_names:
            have, want = allocatable.get(name), requests.get(name)
            if have is None and want is None:
                continue  # Koordinator stops here and matches whatever the other names say (⚠)
            if have is None or want is None or have != want:
                return False
        return True


def parse_exact_match(text: str) -> ExactMatch:
    where = EXACT_MATCH
    if not text:
        return ExactMatch()
    data = d.struct(gojson.loads(text, where), where, ("resourceNames",))
    names = d.array(data, "resourceNames", where)
    if not all(isinstance(n, str) for n in names):
        raise CodecError(d.join(where, "resourceNames"), "expected a list of resource names", names)
    return ExactMatch(tuple(names))


def is_reservation_ignored(labels: Mapping[str, str]) -> bool:
    return labels.get(RESERVATION_IGNORED) == "true"
