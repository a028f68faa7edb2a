"""Where kubelet's Topology Manager will align a pod, so that the devices chosen are the ones kubelet
hands over (docs/agent.md, "kubelet's Topology Manager").

On a node whose agent publishes a Topology Manager policy (best-effort, restricted or
single-numa-node; apis/kubelet_policy.py), kubelet merges NUMA hints from the device plugins' free
IDs and, with the static CPU manager, from the free CPUs, and offers the plugin only devices of the
merged NUMA node(s): an annotation naming a device elsewhere is refused at admission. So the
allocator computes the same merge from the node's kubelet view (node/kubelet_view.py) and chooses
devices only there (the `numa_mask` of `devices.allocate`); a pod kubelet's policy would not admit
(restricted, single-numa-node: no preferred hint) is not placed on the node.

The merge follows kubelet's (pkg/kubelet/cm/topologymanager: hints per resource over every NUMA
mask, narrowest preferred; a permutation of one hint per resource is preferred when all are and
their masks agree; preferred beats not, then the narrower mask, then the lower one; single-numa-node
keeps single-NUMA preferred hints only). The pod is aligned as a whole (kubelet's `pod` scope; with
the `container` scope the same for a pod with one device container). With the static CPU manager, a
Guaranteed pod is placed only where its pinned CPUs fit on the one NUMA node its devices go to:
kubelet's own rules for spreading them are not modelled, and node/kubelet_view.py counts each pod's
CPUs on its devices' NUMA node.
"""

from __future__ import annotations

from itertools import combinations
from typing import NamedTuple

from allocator.core.node.kubelet_view import KubeletView, kubelet_view
from allocator.core.node.state import NodeState
from allocator.core.reasons import Rejection
from allocator.core.request.pod_request import PodRequest
from apis import resources as rn

TOPOLOGY_MANAGER = "topoalloc: kubelet Topology Manager"
ALIGNED = (rn.NVIDIA_GPU, rn.GPU_CORE, rn.GPU, rn.RDMA)  # what the agent's device plugins serve, with NUMA


class Hint(NamedTuple):
    mask: int | None  # bit n: NUMA node n; None: any
    preferred: bool


def _masks(nodes: tuple[int, ...]) -> list[int]:
    return [
        sum(1 << n for n in combo) for size in range(1, len(nodes) + 1) for combo in combinations(nodes, size)
    ]


def _bits(mask: int, nodes: tuple[int, ...]) -> list[int]:
    return [n for n in nodes if mask >> n & 1]


def _hints(nodes: tuple[int, ...], total: dict[int, int], free: dict[int, int], want: int) -> list[Hint]:
    """Every mask with `want` free, preferred when as narrow as the narrowest holding `want` at all."""
    found, narrowest = [], len(nodes)
    for mask in _masks(nodes):
        bits = _bits(mask, nodes)
        if sum(total.get(n, 0) for n in bits) >= want:
            narrowest = min(narrowest, len(bits))
        if sum(free.get(n, 0) for n in bits) >= want:
            found.append(mask)
    return [Hint(m, m.bit_count() == narrowest) for m in found]


def _providers(view: KubeletView, req: PodRequest) -> list[list[Hint]]:
    """One hint list per resource, as kubelet filters them (no preference: [any, preferred])."""
    out = []
    for resource in ALIGNED:
        want = req.scalars.get(resource, 0)
        counts = view.resources.get(resource)
        if not want or counts is None:
            continue
        if not counts.aligned:
            out.append([Hint(None, True)])
        elif counts.free_anywhere < want:
            out.append([Hint(None, False)])
        else:
            out.append(
                _hints(view.numa_nodes, dict(counts.total), dict(counts.free), want) or [Hint(None, False)]
            )
    if view.static_cpus and req.exclusive_cpus:
        cpus = _hints(view.numa_nodes, dict(view.cpus_total), dict(view.cpus_free), req.exclusive_cpus)
        out.append(cpus or [Hint(None, False)])
    return out


def _fitter(masks: set[int]) -> int:
    """The narrowest mask, then the lowest (kubelet's bitmask.IsNarrowerThan)."""
    return min(masks, key=lambda m: (m.bit_count(), m))


def merge(policy: str, nodes: tuple[int, ...], providers: list[list[Hint]]) -> tuple[Hint, bool]:
    """(best hint, admitted) under kubelet's policy.

    kubelet merges every permutation of one hint per provider (the AND of their masks, preferred
    when all are and their masks agree) and keeps the best by HintMerger.compare. Its outcome
    depends only on the set of merged masks, which is what is computed here: the permutations
    themselves number up to 255^providers on an 8-NUMA-node machine."""
    default = sum(1 << n for n in nodes)
    if policy == "single-numa-node":
        providers = [
            [h for h in hs if h.preferred and (h.mask is None or h.mask.bit_count() == 1)] for hs in providers
        ]
    best = _best(default, providers)
    if policy == "single-numa-node" and best.mask == default:
        best = Hint(None, best.preferred)
    return best, policy == "best-effort" or best.preferred


def _best(default: int, providers: list[list[Hint]]) -> Hint:
    if any(not hs for hs in providers):
        return Hint(default, False)  # no permutation at all
    # preferred: one preferred hint per provider, their masks all equal (an `any` hint agrees
    # with every mask; all `any` merges to the default mask)
    options = [{h.mask for h in hs if h.preferred} for hs in providers]
    masks = {m for opts in options for m in opts if m is not None}
    preferred = {m for m in masks if all(m in opts or None in opts for opts in options)}
    if all(None in opts for opts in options):
        preferred.add(default)
    preferred.discard(0)
    if preferred:
        return Hint(_fitter(preferred), True)
    merged = {default}
    for hs in providers:
        merged = {m & (default if h.mask is None else h.mask) for m in merged for h in hs}
    merged.discard(0)
    if not merged:
        return Hint(default, False)
    narrowest = [
        _fitter({h.mask for h in hs if h.mask is not None}) for hs in providers if any(h.mask for h in hs)
    ]
    target = max((m.bit_count() for m in narrowest), default=0)
    at = {m for m in merged if m.bit_count() == target}
    below = {m for m in merged if m.bit_count() < target}
    if at:
        return Hint(_fitter(at), False)
    if below:
        most = max(m.bit_count() for m in below)
        return Hint(_fitter({m for m in below if m.bit_count() == most}), False)
    return Hint(_fitter(merged), False)


def kubelet_alignment(state: NodeState, req: PodRequest) -> frozenset[int] | Rejection | None:
    """The NUMA nodes kubelet will align this pod's devices on; None: kubelet does not restrict them
    here (no policy, nothing it aligns, or any NUMA node); a Rejection: its policy refuses the pod."""
    view = kubelet_view(state)
    if view is None or req.invalid is not None or not view.numa_nodes:
        return None
    if not any(req.scalars.get(r, 0) for r in ALIGNED):
        return None  # no device of ours: kubelet aligns its CPUs alone, the allocator chooses nothing
    best, admitted = merge(view.policy, view.numa_nodes, _providers(view, req))
    if not admitted:
        return Rejection(
            TOPOLOGY_MANAGER,
            f"kubelet's Topology Manager ({view.policy}) cannot align the pod's devices and CPUs on "
            + ("one NUMA node" if view.policy == "single-numa-node" else "the fewest NUMA nodes"),
            detail=_detail(view, req),
        )
    if view.static_cpus and req.exclusive_cpus:
        # the static CPU manager pins the pod's CPUs on the aligned NUMA node if they fit there and
        # spreads them by its own topology rules otherwise: only the first is placed, so that what
        # this node has left stays known (restricted and single-numa-node never spread them)
        home = _bits(best.mask, view.numa_nodes) if best.mask is not None else list(view.numa_nodes)
        if len(home) != 1 or view.cpus_free.get(home[0], 0) < req.exclusive_cpus:
            return Rejection(
                TOPOLOGY_MANAGER,
                f"kubelet's Topology Manager ({view.policy}) would spread the pod's pinned CPUs over "
                "NUMA nodes",
                detail=_detail(view, req),
            )
    if best.mask is None or best.mask == sum(1 << n for n in view.numa_nodes):
        return None
    return frozenset(_bits(best.mask, view.numa_nodes))


def misaligned(inner: Rejection, numa: frozenset[int], state: NodeState) -> Rejection:
    """The devices do not fit on the NUMA node(s) kubelet aligns the pod on."""
    view = kubelet_view(state)
    policy = view.policy if view is not None else "?"
    return Rejection(
        TOPOLOGY_MANAGER,
        f"kubelet's Topology Manager ({policy}) aligns the pod where its devices do not fit",
        inner.unresolvable,
        f"NUMA {','.join(map(str, sorted(numa)))}: {inner.explained}",
    )


def _detail(view: KubeletView, req: PodRequest) -> str:
    parts = []
    for resource in ALIGNED:
        want = req.scalars.get(resource, 0)
        counts = view.resources.get(resource)
        if want and counts is not None:
            free = ", ".join(f"NUMA {n}: {counts.free.get(n, 0)}" for n in view.numa_nodes)
            parts.append(f"{want} {resource} wanted ({free} free)")
    if view.static_cpus and req.exclusive_cpus:
        free = ", ".join(f"NUMA {n}: {view.cpus_free.get(n, 0)}" for n in view.numa_nodes)
        parts.append(f"{req.exclusive_cpus} exclusive CPUs wanted ({free} free)")
    return "; ".join(parts)
