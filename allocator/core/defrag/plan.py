"""The defragmentation plan: which running pods move where, and what each move unblocks.

`plan_defrag(cluster, waiters, pods, settings, now)` takes the waiters in the order given (the
caller's queue order: priority, then age) and, on a private copy of the cluster, for each one that
does not fit as things are, finds the cheapest movers among the pods that may move for it
(`inputs.why_immovable`; search.py), lands each mover's replacement with the core's gang planner
off its own node, and keeps the moves and the waiter's placement on the copy so the next waiter
plans around them. A waiter that fits already is placed on the copy and needs no move; one no
set of moves unblocks keeps the reason. Every move belongs to a waiter it unblocks; with no
waiter unblocked and `proactive` on, the cheapest node whose GPU pods may all move is cleared
when that raises the largest free block (or the number of nodes having it). Never more than
`max_moves` moves in one plan. Pure: the cluster is not changed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from allocator.core.cluster.state import ClusterState
from allocator.core.defrag.blocks import block_rank, largest_block
from allocator.core.defrag.inputs import DefragPlanSettings, PodFacts, Waiter, why_immovable
from allocator.core.defrag.scratch import WAITER_PREFIX, Found, Trial, commit, fork_cluster, land
from allocator.core.defrag.search import cheapest_moves
from allocator.core.devices.allocate import Allocation
from allocator.core.gang.plan import GangPlan, fork_node, plan_gang
from allocator.core.node.state import NodeState
from apis import resources as rn

PROACTIVE = "largest free block"


@dataclass(frozen=True)
class Move:
    key: str  # the pod moved
    uid: str
    workload: str
    source: str
    target: str
    allocation: Allocation  # the replacement's devices on the target
    gpus: int
    gpu_hours: float  # work thrown away
    unblocks: str  # the waiter's name (PROACTIVE for a proactive move)


@dataclass(frozen=True)
class Unblocked:
    waiter: str
    moves: tuple[str, ...]  # pod keys
    plan: GangPlan | None  # where the waiter goes once they moved (None: proactive)
    exact: bool  # the cheapest moves there are (False: inclusion-minimal, the search budget ran out)


@dataclass(frozen=True)
class DefragPlan:
    moves: tuple[Move, ...]
    unblocked: tuple[Unblocked, ...]
    fits: tuple[str, ...]  # waiters that fit without a move
    stuck: tuple[tuple[str, str], ...]  # (waiter, why no move unblocks it)
    largest_before: int
    largest_after: int  # after the moves, before the waiters take their room

    @property
    def gpu_hours(self) -> float:
        return sum(m.gpu_hours for m in self.moves)


def plan_defrag(
    cluster: ClusterState,
    waiters: Sequence[Waiter],
    pods: Iterable[PodFacts],
    settings: DefragPlanSettings | None = None,
    *,
    now: float = 0.0,
    names: Sequence[str] | None = None,
) -> DefragPlan:
    """See the module. `names`: the nodes moves may use (default: every node)."""
    settings = settings or DefragPlanSettings()
    scratch = fork_cluster(cluster)
    pool = sorted(scratch.nodes if names is None else (n for n in names if n in scratch.nodes))
    facts = {p.key: p for p in pods if p.node in scratch.nodes and p.key in scratch.nodes[p.node].pods}
    before = largest_block(scratch.nodes.values())
    moves: list[Move] = []
    unblocked: list[Unblocked] = []
    fits: list[str] = []
    stuck: list[tuple[str, str]] = []
    moved: set[str] = set()
    for waiter in waiters:
        where = list(waiter.names) if waiter.names is not None else pool
        direct = plan_gang(scratch, waiter.members, settings.plan, names=where)
        if isinstance(direct, GangPlan):
            commit(scratch, Found((), direct), waiter)
            fits.append(waiter.name)
            continue
        if direct.unresolvable:
            stuck.append((waiter.name, direct.message))
            continue
        left = settings.max_moves - len(moves)
        if left <= 0:
            stuck.append((waiter.name, f"this plan already moves {len(moves)} pods (max_moves)"))
            continue
        movable = [
            p
            for p in facts.values()
            if p.key not in moved and not why_immovable(p, waiter.priority, settings)
        ]
        got = cheapest_moves(scratch, waiter, movable, pool, settings, now, left) if movable else None
        if got is None:
            why = (
                "no pod may move for it"
                if not movable
                else f"no {left} moves or fewer of movable pods make room"
            )
            stuck.append((waiter.name, f"{why} ({direct.message})"))
            continue
        found, exact = got
        commit(scratch, found, waiter)
        keys = _record(found, waiter.name, now, moves, moved)
        unblocked.append(Unblocked(waiter.name, keys, found.plan, exact))
    if settings.proactive and not unblocked:
        found = _proactive(scratch, list(facts.values()), pool, settings, now)
        if found is not None:
            commit(scratch, found, None)
            unblocked.append(Unblocked(PROACTIVE, _record(found, PROACTIVE, now, moves, moved), None, False))
    after = largest_block(_without_waiters(scratch))
    return DefragPlan(tuple(moves), tuple(unblocked), tuple(fits), tuple(stuck), before, after)


def _without_waiters(cluster: ClusterState) -> list[NodeState]:
    """The nodes after the moves, before the waiters take their room."""
    out = []
    for state in cluster.nodes.values():
        held = [k for k in state.pods if k.startswith(WAITER_PREFIX)]
        if held:
            state = fork_node(state)
            for key in held:
                state.remove_pod(key)
        out.append(state)
    return out


def _record(found: Found, waiter: str, now: float, moves: list[Move], moved: set[str]) -> tuple[str, ...]:
    for p, placed in found.landings:
        moves.append(
            Move(
                p.key,
                p.uid,
                p.workload,
                p.node,
                placed.node,
                placed.allocation,
                p.gpus,
                p.gpu_hours(now),
                waiter,
            )
        )
        moved.add(p.key)
    return tuple(p.key for p, _ in found.landings)


def _proactive(
    cluster: ClusterState, pods: list[PodFacts], pool: Sequence[str], settings: DefragPlanSettings, now: float
) -> Found | None:
    """The cheapest node whose GPU pods may all move and whose clearing raises the block rank."""
    before = block_rank(cluster.nodes.values())
    on_node: dict[str, list[PodFacts]] = {}
    for p in pods:
        on_node.setdefault(p.node, []).append(p)
    candidates = []
    for node in pool:
        state = cluster.nodes[node]
        here = on_node.get(node, [])
        gpu_keys = {e.key for e in state.pods.values() if any(u[0] == rn.DeviceType.GPU for u in e.used)}
        known = {p.key for p in here}
        movers = [p for p in here if not why_immovable(p, settings.proactive_priority, settings)]
        if (
            not gpu_keys
            or gpu_keys - known
            or len(movers) < len(gpu_keys)
            or len(movers) > settings.max_moves
        ):
            continue
        candidates.append((len(movers), sum(p.gpu_hours(now) for p in movers), node, movers))
    for _, _, node, movers in sorted(candidates, key=lambda c: c[:3]):
        trial = Trial(cluster)
        try:
            trial.take(movers)
            landings = land(trial, movers, [n for n in pool if n != node], settings.plan)
            if landings is not None and block_rank(cluster.nodes.values()) > before:
                return Found(tuple(landings), None)
        finally:
            trial.undo()
    return None
