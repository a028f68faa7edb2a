"""Whether a node satisfies a NodeSelectorTerm (corev1's nodeSelectorTerms: a pod's required node
affinity, a Reservation's reservationSelectorTerms, a DaemonSet's node affinity), matched as
kube-scheduler matches them: the one copy the allocator's core and the installer share.

A requirement is `(key, operator, values)`; `In`, `NotIn`, `Exists`, `DoesNotExist`, and `Gt`/`Lt`
with one integer value. A term ANDs its label requirements (`matchExpressions`) and its field
requirements (`matchFields`, of which `metadata.name` is the one field); a term with neither
matches nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# (key, operator, values): one requirement of a selector term.
Requirement = tuple[str, str, tuple[str, ...]]
OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


def requirement_matches(req: Requirement, labels: Mapping[str, str]) -> bool:
    key, op, values = req
    present = key in labels
    if op == "In":
        return present and labels[key] in values
    if op == "NotIn":
        return not present or labels[key] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op not in ("Gt", "Lt") or not present or len(values) != 1:
        return False
    try:
        have, want = int(labels[key]), int(values[0])
    except ValueError:
        return False
    return have > want if op == "Gt" else have < want


def term_matches(
    expressions: Iterable[Requirement], fields: Iterable[Requirement], labels: Mapping[str, str], name: str
) -> bool:
    """One term against a node's `labels`, `metadata.name` being `name`."""
    expressions, fields = tuple(expressions), tuple(fields)
    if not expressions and not fields:
        return False
    by_field = {"metadata.name": name}
    return all(requirement_matches(r, labels) for r in expressions) and all(
        requirement_matches(r, by_field) for r in fields
    )


def requirements(items: Iterable[Any]) -> tuple[Requirement, ...]:
    """The requirements of a term's `matchExpressions` or `matchFields` as written in an object the
    caller trusts (a rendered manifest); what is not a requirement matches nothing."""
    out = []
    for item in items:
        if isinstance(item, Mapping):
            values = tuple(str(v) for v in item.get("values") or [])
            out.append((str(item.get("key", "")), str(item.get("operator", "")), values))
    return tuple(out)
