"""Which running pods preemption may remove, and the cheapest set of them that makes room.

A `Candidate` is a pod already placed, with its priority, for a member of a running gang the gang,
and the PodDisruptionBudgets that select it with the disruptions each allows now. Candidates are
evicted in `Unit`s: a pod on its own, or every pod of a gang together (a gang missing one member is
a broken job, so a member is never a victim alone). A unit is eligible only when every pod in it
has a priority strictly below the preemptor's.

`cheapest(units, feasible, ...)` finds the set of units whose removal makes `feasible` true at the
lowest `cost`: fewest PodDisruptionBudget violations (`violations`: victims the Eviction API would
refuse, counted as kube-scheduler's preemption counts them, which prefers the candidate with the
fewest), then fewest pods, then the lowest highest priority among them, then the lowest sum of
priorities, then the fewest GPUs they hold, then names (so equal choices come out the same).

It first looks for a set that violates no budget: exactly while the number of subsets to look at
stays within a budget (subsets are visited by pod count, cheapest first, and a subset that cannot
touch enough GPUs is skipped unseen); past it, an inclusion-minimal set among the units that
violate nothing (everything removed, then each unit put back, the most valuable first, whenever
the rest still makes room). Only when no such set makes room are protected pods weighed, and then
as the last resort: an inclusion-minimal set of all units that puts the protected ones back first
(kube-scheduler's reprieve order). `feasible` must be monotone (removing more never hurts), which
holds for device, cpu, memory and pod-slot room.
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
    # (PodDisruptionBudget "ns/name", disruptions it allows now) for each budget selecting the pod
    budgets: tuple[tuple[str, int], ...] = ()


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


Cost = tuple[int, int, int, int, int, tuple[str, ...]]


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


def violations(pods: Iterable[Candidate]) -> int:
    """How many of these victims a PodDisruptionBudget would keep: in key order each takes one of
    the disruptions every budget selecting it allows, and one that finds a budget used up counts
    (kube-scheduler's filterPodsWithPDBViolation counts the same way)."""
    left: dict[str, int] = {}
    count = 0
    for pod in sorted(pods, key=lambda c: c.key):
        over = False
        for budget, allowed in pod.budgets:
            left[budget] = left.get(budget, allowed) - 1
            over = over or left[budget] < 0
        count += over
    return count


def protected(unit: Unit) -> bool:
    """Evicting the unit alone would already violate a budget."""
    return violations(unit.pods) > 0


def cost(units: Iterable[Unit]) -> Cost:
    units = list(units)
    pods = [p for u in units for p in u.pods]
    return (
        violations(pods),
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
    units = sorted(units, key=lambda u: u.name)
    if feasible(()):
        return Choice((), True)
    if not units or not feasible(units):
        return None
    found, at = least_violating(units, feasible, shortfall=shortfall, budget=budget)
    if found is None and at == 0:
        found = calm_spare(units, feasible, keep_first)
    return found if found is not None else last_resort(units, feasible, keep_first)


def least_violating(
    units: Sequence[Unit],
    feasible: Callable[[Sequence[Unit]], bool],
    *,
    shortfall: int = 0,
    budget: Budget | None = None,
) -> tuple[Choice | None, int]:
    """The cheapest feasible non-empty set by `cost` (fewest budget violations, then the rest),
    looked for among the sets with no violation, then with at most one, and so on; with the
    number of violations it was looking at when the search budget ran out (None), or its own."""
    feasible = _Remembered(feasible)
    tally = _Tally(budget or Budget())
    top = violations(p for u in units for p in u.pods)
    for most in range(top + 1):
        found, complete = search(units, feasible, shortfall=shortfall, most=most, tally=tally)
        if found is not None or not complete:
            return found, most
    return None, top


def calm_spare(
    units: Sequence[Unit],
    feasible: Callable[[Sequence[Unit]], bool],
    keep_first: Callable[[Unit], object] | None = None,
) -> Choice | None:
    """An inclusion-minimal set among the units that violate no budget alone, when it makes room
    and violates none together; else None."""
    calm = [u for u in units if not protected(u)]
    if not calm or not feasible(calm):
        return None
    found = spare(calm, feasible, keep_first)
    return found if violations(found.victims) == 0 else None


def last_resort(
    units: Sequence[Unit],
    feasible: Callable[[Sequence[Unit]], bool],
    keep_first: Callable[[Unit], object] | None = None,
) -> Choice:
    """Budgets cannot all be kept: an inclusion-minimal set that puts the protected units back
    first (so as few stay as the room needs), then as `keep_first` orders (`feasible(units)`
    must hold)."""
    order = keep_first or _most_valuable
    return spare(units, feasible, lambda u: (not protected(u), order(u)))


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
    """The cheapest feasible non-empty set by pod count first (budget violations only order sets
    of one count), or None when the budget ran out first (or none is)."""
    return search(units, feasible, shortfall=shortfall, tally=_Tally(budget or Budget()))[0]


class _Tally:
    """What a search has spent of its budget (shared by the searches of one choice)."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.subsets = 0
        self.checks = 0


class _Remembered:
    """`feasible` asked once per set: the searches for more violations see the sets of fewer
    again, which cost no check the second time."""

    def __init__(self, feasible: Callable[[Sequence[Unit]], bool]) -> None:
        self.feasible = feasible
        self.seen: dict[frozenset[str], bool] = {}

    def known(self, units: Sequence[Unit]) -> bool:
        return frozenset(u.name for u in units) in self.seen

    def __call__(self, units: Sequence[Unit]) -> bool:
        key = frozenset(u.name for u in units)
        if key not in self.seen:
            self.seen[key] = self.feasible(units)
        return self.seen[key]


def search(
    units: Sequence[Unit],
    feasible: Callable[[Sequence[Unit]], bool],
    *,
    shortfall: int = 0,
    most: int | None = None,
    tally: _Tally,
) -> tuple[Choice | None, bool]:
    """The cheapest feasible non-empty set (with `most`, among the sets with at most that many
    budget violations), and whether the search was complete (False: the budget ran out first).
    Subsets go by increasing pod count, cheapest first within one count: a subset of k units has
    at least k pods, so once every subset of up to k units is known, every count up to k is."""
    budget = tally.budget
    units = sorted((u for u in units if most is None or violations(u.pods) <= most), key=lambda u: u.name)
    n = len(units)
    by_pods: dict[int, list[tuple[Cost, tuple[Unit, ...]]]] = {}
    most_gpus = sorted((u.gpus for u in units), reverse=True)
    settled = 0  # pod counts up to this one were looked at completely
    total_pods = sum(len(u.pods) for u in units)
    for k in range(1, n + 1):
        if sum(most_gpus[:k]) >= shortfall:
            for combo in combinations(units, k):
                tally.subsets += 1
                if tally.subsets > budget.subsets:
                    return None, False
                if sum(u.gpus for u in combo) < shortfall:
                    continue
                c = cost(combo)
                if most is not None and c[0] > most:
                    continue  # together they break more budgets than allowed
                by_pods.setdefault(c[1], []).append((c, combo))
        upto = k if k < n else total_pods
        while settled < upto:
            settled += 1
            for _, combo in sorted(by_pods.pop(settled, ()), key=lambda cc: cc[0]):
                if not (isinstance(feasible, _Remembered) and feasible.known(combo)):
                    tally.checks += 1
                    if tally.checks > budget.checks:
                        return None, False
                if feasible(combo):
                    return Choice(combo, True), True
    return None, True


def _spare(
    units: Sequence[Unit], feasible: Callable[[Sequence[Unit]], bool], order: Callable[[Unit], object]
) -> tuple[Unit, ...]:
    chosen = list(units)
    for u in sorted(units, key=order):  # type: ignore[arg-type]
        trial = [x for x in chosen if x is not u]
        if feasible(trial):
            chosen = trial
    return tuple(sorted(chosen, key=lambda u: u.name))
