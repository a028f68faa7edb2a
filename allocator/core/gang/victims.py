"""Which running pods preemption may remove, and the cheapest set of them that makes room.

A `Candidate` is a pod already placed, with its priority and, for a member of a running gang, the
gang. Candidates are evicted in `Unit`s: a pod on its own, or every pod of a gang together (a gang
missing one member is a broken job, so a member is never a victim alone). A unit is eligible only
when every pod in it has a priority strictly below the preemptor's.

`cheapest(units, feasible, ...)` finds the set of units whose removal makes `feasible` true at the
lowest `cost`: fewest pods, then the lowest highest priority among them, then the lowest sum of
priorities, then the fewest GPUs they hold, then names (so equal choices come out the same). It is
exact while the number of subsets to look at stays within a budget (subsets are visited by pod
count, cheapest first, and a subset that cannot touch enough GPUs is skipped unseen); past it, it
falls back to an inclusion-minimal set: everything removed, then each unit put back, the most
valuable first, whenever the rest still makes room. `feasible` must be monotone (removing more
never hurts), which holds for device, cpu, memory and pod-slot room.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import combinations


@dataclass(frozen=True)
class Candidate:
    key: str  # namespace/name
    node: str
    priority: int
    gang: str = ""  # the running gang it belongs to ("" for a pod on its own)
    uid: str = ""


@dataclass(frozen=True)
class Unit:
    """What is evicted together: one pod, or every pod of a gang."""

    name: str  # the pod key, or "gang NS/NAME"
    pods: tuple[Candidate, ...]
    priority: int  # the highest of its pods'
    gpus: int  # GPUs its pods hold on the nodes considered

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(p.key for p in self.pods)


@dataclass(frozen=True)
class Budget:
    """How far the exact search may go before settling for an inclusion-minimal set."""

    subsets: int = 20_000  # subsets enumerated
    checks: int = 256  # feasibility checks (each one places the preemptor)


Cost = tuple[int, int, int, int, tuple[str, ...]]


def units_of(
    candidates: Iterable[Candidate], below: int, gpus: Callable[[Candidate], int] = lambda c: 0
) -> list[Unit]:
    """The eligible units: pods of one gang grouped (the gang is eligible only if all its pods
    are), every pod's priority below `below`. `gpus(candidate)`: the GPUs that pod holds."""
    alone: list[Unit] = []
    gangs: dict[str, list[Candidate]] = {}
    for c in candidates:
        if c.gang:
            gangs.setdefault(c.gang, []).append(c)
        elif c.priority < below:
            alone.append(Unit(c.key, (c,), c.priority, gpus(c)))
    for gang, pods in gangs.items():
        if all(p.priority < below for p in pods):
            pods.sort(key=lambda p: p.key)
            top = max(p.priority for p in pods)
            alone.append(Unit(f"gang {gang}", tuple(pods), top, sum(gpus(p) for p in pods)))
    alone.sort(key=lambda u: u.name)
    return alone


def cost(units: Iterable[Unit]) -> Cost:
    units = list(units)
    pods = [p for u in units for p in u.pods]
    return (
        len(pods),
        max((p.priority for p in pods), default=-(2**31)),
        sum(p.priority for p in pods),
        sum(u.gpus for u in units),
        tuple(sorted(u.name for u in units)),
    )


@dataclass(frozen=True)
class Choice:
    units: tuple[Unit, ...]
    exact: bool  # the cheapest set there is (False: inclusion-minimal, the budget ran out)

    @property
    def victims(self) -> tuple[Candidate, ...]:
        return tuple(p for u in self.units for p in u.pods)


def cheapest(
    units: Sequence[Unit],
    feasible: Callable[[Sequence[Unit]], bool],
    *,
    shortfall: int = 0,
    budget: Budget | None = None,
    keep_first: Callable[[Unit], object] | None = None,
) -> Choice | None:
    """The cheapest set of `units` whose removal makes `feasible` true, or None when not even
    removing all of them does. `shortfall`: GPUs the removed units must hold at least (a bound
    that skips hopeless subsets). `keep_first`: the order in which the fallback tries to spare
    units (default: the most valuable first)."""
    budget = budget or Budget()
    units = sorted(units, key=lambda u: u.name)
    if feasible(()):
        return Choice((), True)
    if not units or not feasible(units):
        return None
    found = cheapest_exact(units, feasible, shortfall=shortfall, budget=budget)
    return found if found is not None else spare(units, feasible, keep_first)


def spare(
    units: Sequence[Unit],
    feasible: Callable[[Sequence[Unit]], bool],
    keep_first: Callable[[Unit], object] | None = None,
) -> Choice:
    """An inclusion-minimal set: all `units` removed (which must be feasible), then each put back,
    in `keep_first` order (default: the most valuable first), whenever the rest still suffices."""
    return Choice(_spare(units, feasible, keep_first or _most_valuable), False)


def _most_valuable(u: Unit) -> object:
    return (-u.priority, -len(u.pods), -u.gpus, u.name)


def cheapest_exact(
    units: Sequence[Unit],
    feasible: Callable[[Sequence[Unit]], bool],
    *,
    shortfall: int = 0,
    budget: Budget | None = None,
) -> Choice | None:
    """The cheapest feasible non-empty set, or None when the budget ran out first (or none is).
    Subsets go by increasing pod count, cheapest first within one count: a subset of k units has
    at least k pods, so once every subset of up to k units is known, every count up to k is."""
    budget = budget or Budget()
    units = sorted(units, key=lambda u: u.name)
    n = len(units)
    by_pods: dict[int, list[tuple[Cost, tuple[Unit, ...]]]] = {}
    most_gpus = sorted((u.gpus for u in units), reverse=True)
    seen = checks = 0
    settled = 0  # pod counts up to this one were looked at completely
    total_pods = sum(len(u.pods) for u in units)
    for k in range(1, n + 1):
        if sum(most_gpus[:k]) >= shortfall:
            for combo in combinations(units, k):
                seen += 1
                if seen > budget.subsets:
                    return None
                if sum(u.gpus for u in combo) < shortfall:
                    continue
                c = cost(combo)
                by_pods.setdefault(c[0], []).append((c, combo))
        upto = k if k < n else total_pods
        while settled < upto:
            settled += 1
            for _, combo in sorted(by_pods.pop(settled, ()), key=lambda cc: cc[0]):
                checks += 1
                if checks > budget.checks:
                    return None
                if feasible(combo):
                    return Choice(combo, True)
    return None


def _spare(
    units: Sequence[Unit], feasible: Callable[[Sequence[Unit]], bool], order: Callable[[Unit], object]
) -> tuple[Unit, ...]:
    chosen = list(units)
    for u in sorted(units, key=order):  # type: ignore[arg-type]
        trial = [x for x in chosen if x is not u]
        if feasible(trial):
            chosen = trial
    return tuple(sorted(chosen, key=lambda u: u.name))
