"""kubelet's Topology Manager for the stand-in kubelet, as kubelet's source does it (v1.35:
pkg/kubelet/cm/topologymanager policy.go, policy_best_effort.go, policy_restricted.go,
policy_single_numa_node.go, bitmask/bitmask.go; the device manager's topology_hints.go and
filterByAffinity/devicesToAllocate in manager.go; the static CPU manager's GetTopologyHints and
generateCPUTopologyHints in cpumanager/policy_static.go).

Written apart from the allocator's own emulation (allocator/core/devices/numa_policy.py) on
purpose: this is the oracle the tests hold the allocator to.

NUMA masks are ints (bit n = NUMA node n), compared as kubelet compares its uint64 bitmasks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import combinations

NONE, BEST_EFFORT, RESTRICTED, SINGLE_NUMA_NODE = "none", "best-effort", "restricted", "single-numa-node"
POLICIES = (NONE, BEST_EFFORT, RESTRICTED, SINGLE_NUMA_NODE)
CONTAINER_SCOPE, POD_SCOPE = "container", "pod"


@dataclass(frozen=True)
class Hint:
    mask: int | None  # None: any NUMA node (kubelet's nil NUMANodeAffinity)
    preferred: bool


def count(mask: int) -> int:
    return mask.bit_count()


def narrower(a: int, b: int) -> bool:
    """bitmask.IsNarrowerThan: fewer bits, then the smaller value."""
    return a < b if count(a) == count(b) else count(a) < count(b)


def masks(nodes: list[int]) -> Iterator[int]:
    """bitmask.IterateBitMasks: every combination, by size, in lexicographic order."""
    for size in range(1, len(nodes) + 1):
        for combo in combinations(sorted(nodes), size):
            yield sum(1 << n for n in combo)


def device_hints(
    nodes: list[int], numa_of: dict[str, int], available: Iterable[str], request: int
) -> list[Hint] | None:
    """The device manager's hints for one resource: `numa_of` every device of the resource (-1 for
    one without topology), `available` its healthy unallocated ones. None: no device has topology
    (no preference); []: not enough available."""
    if not any(n >= 0 for n in numa_of.values()):
        return None
    available = list(available)
    if len(available) < request:
        return []
    min_size = len(nodes)
    hints = []
    for mask in masks(nodes):
        in_mask = sum(1 for n in numa_of.values() if n >= 0 and mask >> n & 1)
        if in_mask >= request and count(mask) < min_size:
            min_size = count(mask)
        matching = sum(1 for d in available if numa_of[d] >= 0 and mask >> numa_of[d] & 1)
        if matching >= request:
            hints.append(Hint(mask, False))
    return [Hint(h.mask, count(h.mask or 0) == min_size) for h in hints]


def cpu_hints(
    nodes: list[int], all_cpus: dict[int, int], available: dict[int, int], request: int
) -> list[Hint]:
    """The static CPU manager's hints: `all_cpus` CPUs per NUMA node (for the narrowest size),
    `available` assignable free ones per NUMA node."""
    min_size = len(nodes)
    hints = []
    for mask in masks(nodes):
        bits = [n for n in nodes if mask >> n & 1]
        if sum(all_cpus.get(n, 0) for n in bits) >= request and count(mask) < min_size:
            min_size = count(mask)
        if sum(available.get(n, 0) for n in bits) >= request:
            hints.append(Hint(mask, False))
    return [Hint(h.mask, count(h.mask or 0) == min_size) for h in hints]


def _filter_providers(providers: list[dict[str, list[Hint] | None]]) -> list[list[Hint]]:
    out: list[list[Hint]] = []
    for hints in providers:
        if not hints:
            out.append([Hint(None, True)])
            continue
        for resource_hints in hints.values():
            if resource_hints is None:
                out.append([Hint(None, True)])
            elif not resource_hints:
                out.append([Hint(None, False)])
            else:
                out.append(list(resource_hints))
    return out


def _merge_permutation(default: int, permutation: tuple[Hint, ...]) -> Hint:
    preferred = True
    affinities: list[int] = []
    for hint in permutation:
        if hint.mask is not None:
            affinities.append(hint.mask)
            if hint.mask != affinities[0]:
                preferred = False
        if not hint.preferred:
            preferred = False
    merged = default
    for a in affinities:
        merged &= a
    return Hint(merged, preferred)


@dataclass
class _Merger:
    default: int
    best_non_preferred: int

    def fitter(self, current: Hint, candidate: Hint) -> Hint:
        assert current.mask is not None and candidate.mask is not None
        if candidate.mask == current.mask:
            return current
        return current if narrower(current.mask, candidate.mask) else candidate

    def compare(self, current: Hint | None, candidate: Hint) -> Hint | None:
        assert candidate.mask is not None
        if count(candidate.mask) == 0:
            return current
        if current is None:
            return candidate
        assert current.mask is not None
        if not current.preferred and candidate.preferred:
            return candidate
        if current.preferred and not candidate.preferred:
            return current
        if current.preferred and candidate.preferred:
            return self.fitter(current, candidate)
        best, cur, cand = self.best_non_preferred, count(current.mask), count(candidate.mask)
        if cur > best:
            return self.fitter(current, candidate)
        if cur == best:
            return current if cand != best else self.fitter(current, candidate)
        if cand > best:
            return current
        if cand == best:
            return candidate
        if cand > cur:
            return candidate
        if cand < cur:
            return current
        return self.fitter(current, candidate)


def _narrowest_count(hints: list[Hint]) -> int:
    found = [h.mask for h in hints if h.mask is not None]
    if not found:
        return 0
    best = found[0]
    for m in found[1:]:
        if narrower(m, best):
            best = m
    return count(best)


def _permutations(lists: list[list[Hint]]) -> Iterator[tuple[Hint, ...]]:
    if not lists:
        yield ()
        return
    for hint in lists[0]:
        for rest in _permutations(lists[1:]):
            yield (hint, *rest)


def merge(policy: str, nodes: list[int], providers: list[dict[str, list[Hint] | None]]) -> tuple[Hint, bool]:
    """The policy's Merge: (best hint, admit)."""
    default = sum(1 << n for n in nodes)
    if policy == NONE:
        return Hint(None, True), True
    filtered = _filter_providers(providers)
    if policy == SINGLE_NUMA_NODE:
        filtered = [
            [h for h in hs if h.preferred and (h.mask is None or count(h.mask) == 1)] for hs in filtered
        ]
    merger = _Merger(default, max((_narrowest_count(hs) for hs in filtered), default=0))
    best: Hint | None = None
    for permutation in _permutations(filtered):
        best = merger.compare(best, _merge_permutation(default, permutation))
    if best is None:
        best = Hint(default, False)
    if policy == SINGLE_NUMA_NODE and best.mask == default:
        best = Hint(None, best.preferred)
    admit = True if policy == BEST_EFFORT else best.preferred
    return best, admit


def filter_by_affinity(
    affinity: int | None, numa_of: dict[str, int], available: Iterable[str]
) -> tuple[list[str], list[str], list[str]]:
    """The device manager's filterByAffinity: (aligned, not aligned, without topology)."""
    available = sorted(available)
    if affinity is None or not any(n >= 0 for n in numa_of.values()):
        return [], [], available
    aligned = [d for d in available if numa_of[d] >= 0 and affinity >> numa_of[d] & 1]
    unaligned = [d for d in available if numa_of[d] >= 0 and not affinity >> numa_of[d] & 1]
    without = [d for d in available if numa_of[d] < 0]
    return aligned, unaligned, without


def devices_to_allocate(
    needed: int,
    affinity: int | None,
    numa_of: dict[str, int],
    available: list[str],
    preferred: Callable[[list[str]], list[str]],
) -> list[str]:
    """devicesToAllocate: `preferred(offered)` is GetPreferredAllocation over those IDs (or [] when
    the plugin does not offer it). Raises ValueError when too few are available."""
    if len(available) < needed:
        raise ValueError(
            f"requested number of devices unavailable: requested {needed}, available {len(available)}"
        )
    aligned, unaligned, without = filter_by_affinity(affinity, numa_of, available)
    chosen: list[str] = []

    def take(ids: Iterable[str]) -> bool:
        for d in ids:
            if d not in chosen:
                chosen.append(d)
                if len(chosen) == needed:
                    return True
        return False

    if affinity is None or (not aligned and not unaligned):  # no alignment: the plugin's choice
        if take(d for d in preferred(available) if d in available) or take(available):
            return chosen
        raise ValueError("unexpectedly allocated less resources than required")
    if needed < len(aligned):
        if take(d for d in preferred(aligned) if d in aligned) or take(aligned):
            return chosen
        raise ValueError("unexpectedly allocated less resources than required")
    if take(aligned):
        return chosen
    if take(d for d in preferred(available) if d in available) or take(unaligned) or take(without):
        return chosen
    raise ValueError("unexpectedly allocated less resources than required")


@dataclass
class StaticCpus:
    """The static CPU manager's state: CPUs per NUMA node, the reserved ones, and who holds which."""

    cpus: dict[int, list[int]]  # NUMA node -> CPU ids
    reserved: set[int] = field(default_factory=set)
    assigned: dict[tuple[str, str], list[int]] = field(default_factory=dict)  # (pod, container) ->

    def numa_of(self, cpu: int) -> int:
        return next(n for n, ids in self.cpus.items() if cpu in ids)

    def free(self) -> list[int]:
        held = {c for ids in self.assigned.values() for c in ids}
        return sorted(
            c for ids in self.cpus.values() for c in ids if c not in held and c not in self.reserved
        )

    def per_numa(self, ids: Iterable[int]) -> dict[int, int]:
        out: dict[int, int] = {}
        for c in ids:
            n = self.numa_of(c)
            out[n] = out.get(n, 0) + 1
        return out

    def hints(self, nodes: list[int], request: int) -> list[Hint]:
        return cpu_hints(
            nodes, {n: len(ids) for n, ids in self.cpus.items()}, self.per_numa(self.free()), request
        )

    def allocate(self, key: tuple[str, str], n: int, affinity: int | None) -> list[int]:
        """Aligned CPUs first (the affinity's NUMA nodes), then any; raises ValueError."""
        free = self.free()
        if len(free) < n:
            raise ValueError(
                f"not enough cpus available to satisfy request: requested={n}, available={len(free)}"
            )
        aligned = [c for c in free if affinity is not None and affinity >> self.numa_of(c) & 1]
        got = (aligned + [c for c in free if c not in aligned])[:n]
        self.assigned[key] = got
        return got

    def release(self, pod: str) -> None:
        for key in [k for k in self.assigned if k[0] == pod]:
            del self.assigned[key]
