"""Which chosen device answers which request: the check every answer passes before it is written.

The core chooses devices for the pod's claims together (so many GPUs, so many NICs); a claim's
results name a device per request. `assign` hands the chosen devices to the request slots so that
each slot gets `count` devices of its kind that pass its selectors, no device twice, and every
constraint holds on the published attributes: a matchAttribute's devices all carry the attribute
with one value, a distinctAttribute's carry it with pairwise different values. A small search with
backtracking (claims have at most 32 requests; the search is capped): None when no hand-out exists,
and then nothing is written for that node.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from allocator.core.request.cel import AttrValue, PublishedDevice
from allocator.core.request.claims import ClaimConstraint, ClaimsRequest

MAX_STEPS = 20_000


def assign(
    creq: ClaimsRequest,
    chosen: Mapping[str, Sequence[str]],
    candidates: Sequence[frozenset[str]],
    devices: Mapping[str, PublishedDevice],
) -> list[tuple[str, ...]] | None:
    """Per slot of `creq`, the devices it gets (from `chosen`, per kind, in preference order;
    `candidates[i]` the devices slot i may take); None when no hand-out satisfies everything."""
    return _Search(creq, chosen, candidates, devices).run()


class _Search:
    def __init__(
        self,
        creq: ClaimsRequest,
        chosen: Mapping[str, Sequence[str]],
        candidates: Sequence[frozenset[str]],
        devices: Mapping[str, PublishedDevice],
    ) -> None:
        self.slots = creq.slots
        self.chosen = chosen
        self.candidates = candidates
        self.devices = devices
        self.of_slot: list[list[ClaimConstraint]] = [[] for _ in self.slots]
        for c in creq.constraints:
            for i in c.slots:
                self.of_slot[i].append(c)
        # Constrained slots first (they decide values), larger before smaller, scarcer before richer.
        self.order = sorted(
            range(len(self.slots)),
            key=lambda i: (not self.of_slot[i], -self.slots[i].count, len(candidates[i]), i),
        )
        self.result: list[tuple[str, ...]] = [()] * len(self.slots)
        self.used: set[str] = set()
        self.steps = 0

    def run(self) -> list[tuple[str, ...]] | None:
        return self.result if self._step(0) else None

    def _value(self, device: str, attribute: str) -> AttrValue | None:
        dev = self.devices.get(device)
        return None if dev is None else dev.attribute(attribute)

    def _step(self, k: int) -> bool:
        if k == len(self.order):
            return True
        self.steps += 1
        if self.steps > MAX_STEPS:
            return False
        i = self.order[k]
        slot = self.slots[i]
        pool = [d for d in self.chosen.get(slot.kind, ()) if d not in self.used and d in self.candidates[i]]
        for combo in self._choices(i, pool, slot.count, self.order[k + 1 :]):
            self.result[i] = combo
            self.used.update(combo)
            if self._step(k + 1):
                return True
            self.used.difference_update(combo)
            self.result[i] = ()
        return False

    def _choices(
        self, i: int, pool: list[str], count: int, later: Sequence[int]
    ) -> Iterator[tuple[str, ...]]:
        """Device sets for slot i consistent with what is already handed out: one per value of its
        matchAttributes, each preferring devices later slots cannot use."""
        matches = [c for c in self.of_slot[i] if not c.distinct]
        groups: dict[tuple[AttrValue | None, ...], list[str]] = {}
        for dev in pool:
            values = tuple(self._value(dev, c.attribute) for c in matches)
            if any(v is None for v in values) or not all(
                self._agrees(c, v) for c, v in zip(matches, values, strict=True)
            ):
                continue
            groups.setdefault(values, []).append(dev)
        demand = {d: sum(1 for j in later if d in self.candidates[j]) for d in pool}
        for members in sorted(groups.values(), key=lambda g: (len(g), g[0])):
            ordered = sorted(members, key=lambda d: (demand[d], members.index(d)))
            combo = self._distinct_pick(i, ordered, count)
            if combo is not None:
                yield combo

    def _agrees(self, c: ClaimConstraint, value: AttrValue | None) -> bool:
        """The value a matchAttribute already has among handed-out devices, if any, is `value`."""
        for j in c.slots:
            for dev in self.result[j]:
                return self._value(dev, c.attribute) == value
        return True

    def _distinct_pick(self, i: int, ordered: list[str], count: int) -> tuple[str, ...] | None:
        distinct = [c for c in self.of_slot[i] if c.distinct]
        taken: list[set[AttrValue]] = []
        for c in distinct:
            taken.append(
                {v for j in c.slots for d in self.result[j] if (v := self._value(d, c.attribute)) is not None}
            )
        picked: list[str] = []
        for dev in ordered:
            values = [self._value(dev, c.attribute) for c in distinct]
            if any(v is None or v in seen for v, seen in zip(values, taken, strict=True)):
                continue
            picked.append(dev)
            for v, seen in zip(values, taken, strict=True):
                seen.add(v)  # type: ignore[arg-type]
            if len(picked) == count:
                return tuple(picked)
        return None


def satisfied(
    creq: ClaimsRequest, handed: Sequence[Sequence[str]], devices: Mapping[str, PublishedDevice]
) -> bool:
    """Whether a hand-out (per slot) meets every constraint: the property `assign` guarantees,
    checked on its own (tests, and the answer the solver is about to return)."""
    for c in creq.constraints:
        values = [
            devices[d].attribute(c.attribute) if d in devices else None for i in c.slots for d in handed[i]
        ]
        if any(v is None for v in values):
            return False
        if c.distinct and len(set(values)) != len(values):
            return False
        if not c.distinct and len(set(values)) > 1:
            return False
    return all(len(h) == s.count for h, s in zip(handed, creq.slots, strict=True))
