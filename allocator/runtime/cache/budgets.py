"""PodDisruptionBudgets as preemption weighs them: per budget its namespace, its selector and the
disruptions it allows now.

Victim choice keeps protected pods for the last resort (allocator/core/gang/victims.py), so each
candidate carries the budgets selecting it with `status.disruptionsAllowed` (written by
kube-controller-manager's disruption controller). As the Eviction API does, a budget whose status
has not caught up with its spec (`observedGeneration` behind `generation`) allows nothing, a
missing `spec.selector` selects no pod and an empty one every pod of the namespace (policy/v1).
A selector that does not decode selects nothing (logged once per change).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from apis.errors import CodecError
from apis.selector import LabelSelector

log = logging.getLogger(__name__)

JSON = dict[str, Any]


@dataclass(frozen=True, slots=True)
class DisruptionBudget:
    key: str  # "ns/name"
    namespace: str
    selector: LabelSelector | None  # None: selects no pod
    allowed: int  # disruptions allowed now


def budget_of(obj: JSON) -> DisruptionBudget:
    meta = obj.get("metadata") or {}
    namespace = str(meta.get("namespace") or "default")
    key = f"{namespace}/{meta.get('name') or ''}"
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    selector = None
    if spec.get("selector") is not None:
        try:
            selector = LabelSelector.from_dict(spec["selector"], "spec.selector")
        except CodecError as exc:
            log.warning("PodDisruptionBudget %s: %s (taken to select no pod)", key, exc)
    allowed = status.get("disruptionsAllowed")
    current = int(status.get("observedGeneration") or 0) >= int(meta.get("generation") or 0)
    if not isinstance(allowed, int) or isinstance(allowed, bool) or not current:
        allowed = 0
    return DisruptionBudget(key, namespace, selector, max(0, allowed))


class DisruptionBudgets:
    """The cluster's budgets, by namespace, as the watch cache keeps them."""

    def __init__(self) -> None:
        self._by_key: dict[str, DisruptionBudget] = {}
        self._by_namespace: dict[str, dict[str, DisruptionBudget]] = {}

    def __len__(self) -> int:
        return len(self._by_key)

    def __contains__(self, key: object) -> bool:
        return key in self._by_key

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._by_key))

    def upsert(self, obj: JSON) -> None:
        budget = budget_of(obj)
        self.delete(budget.key)
        self._by_key[budget.key] = budget
        self._by_namespace.setdefault(budget.namespace, {})[budget.key] = budget

    def delete(self, key: str) -> None:
        old = self._by_key.pop(key, None)
        if old is not None:
            here = self._by_namespace[old.namespace]
            here.pop(key, None)
            if not here:
                del self._by_namespace[old.namespace]

    def selecting(self, namespace: str, labels: Mapping[str, str]) -> tuple[tuple[str, int], ...]:
        """(budget key, disruptions allowed) of every budget selecting a pod with these labels."""
        here = self._by_namespace.get(namespace)
        if not here:
            return ()
        return tuple(
            (b.key, b.allowed)
            for b in sorted(here.values(), key=lambda b: b.key)
            if b.selector is not None and b.selector.matches(labels)
        )
