"""A small world for the gang lifecycle step: member and gang views built by hand, and a fake
planner standing for the cluster.

`FakePlanner` models a cluster by member slots: `free` members fit at once, `per_node` to a node
(n1, n2, ...); a reserve takes a slot per hold and a release gives it back, so the plans made
after a reserve within one step see it (as the ledger's holds are seen by the real planner). It
records every call, and refuses the holds of the keys in `refuse` (undoing the ones made before).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from allocator.core.actions import Event, Evict, Nudge, ObjectRef, Requeue, Ungate
from allocator.core.devices.allocate import Allocation
from allocator.core.gang.actions import Action, Hold, HoldPlan, ReleaseHolds
from allocator.core.gang.levels import Levels
from allocator.core.gang.lifecycle import Step, step
from allocator.core.gang.min_resources import Shortage
from allocator.core.gang.plan import GangPlan, NoPlan, Placement
from allocator.core.gang.preemption import PreemptionPlan
from allocator.core.gang.victims import Candidate
from allocator.core.gang.view import Clocks, Gang, MemberPod, Outcomes
from allocator.core.request.parse import pod_request
from allocator.core.request.pod_request import PodRequest
from apis import keys
from apis import podgroup as pg
from apis import workload as wl
from apis.annotations import DeviceAllocation, DeviceAllocations
from apis.gang_object import native_conditions, of_native, of_podgroup, of_workload
from apis.quantity import Quantity
from apis.timestamps import format_time

NOW = Clocks(mono=5_000.0, wall=1_700_000_000.0)


@dataclass(frozen=True)
class Rules:
    bind_timeout: float = 120.0
    preemption: bool = True
    preemption_timeout: float = 300.0
    starvation_bound: float = 600.0


def later(now: Clocks, seconds: float) -> Clocks:
    return Clocks(now.mono + seconds, now.wall + seconds)


def member(
    name: str,
    *,
    node: str = "",
    gated: bool = True,
    gates: tuple[str, ...] = (),
    phase: str = "Pending",
    priority: int = 0,
    uid: str = "",
    created: int = 0,
    annotations: Mapping[str, str] | None = None,
    koordinator: int | None = None,
    group: str = "g",
) -> MemberPod:
    """Member `name` of gang ns/`group` (a PodGroup's, or Koordinator's with that min-available)."""
    ref = pg.GangRef("ns", group, "koordinator" if koordinator else "podgroup", koordinator)
    all_gates = ((keys.GANG_SCHEDULING_GATE,) if gated else ()) + gates
    return MemberPod(
        key=f"ns/{name}",
        namespace="ns",
        name=name,
        uid=uid or f"uid-{name}",
        gang=ref,
        gang_error="",
        job_group="",
        node=node,
        phase=phase if not node or phase != "Pending" else "Running",
        deleting=False,
        created=format_time(NOW.wall - 3_600 + created),
        gates=all_gates,
        scheduler="default-scheduler",
        annotations=dict(annotations or {}),
        priority=priority,
    )


def gang(
    *members: MemberPod,
    min_member: int = 2,
    podgroup: bool = True,
    timeout: float = 0.0,
    status: dict[str, Any] | None = None,
    min_resources: dict[str, str] | None = None,
    holds: Mapping[str, str] | None = None,
    generation: int = 1,
    outcomes: Outcomes | None = None,
    problem: str = "",
    name: str = "g",
    source: str = pg.PODGROUP_SOURCE,
    levels: Levels | None = None,
    problem_code: str = "InvalidPodGroup",
) -> Gang:
    """A gang defined by `source`'s object (a scheduler-plugins PodGroup by default, a native
    PodGroup whose conditions are `status`'s, a Workload's pod group), or by none (`podgroup=False`:
    Koordinator's)."""
    group = None
    if podgroup and source == pg.PODGROUP_SOURCE:
        group = of_podgroup(
            pg.PodGroup(
                metadata={"name": name, "namespace": "ns"},
                min_member=min_member,
                min_resources={k: Quantity.parse(v) for k, v in (min_resources or {}).items()},
                status=pg.PodGroupStatus.from_dict(status or {}, "status"),
            ),
            "ns",
        )
    elif podgroup and source == pg.NATIVE_SOURCE:
        conditions = native_conditions(status or {})
        policy = wl.SchedulingPolicy(min_member)
        group = of_native(
            wl.NativePodGroup({"name": name, "namespace": "ns"}, policy, conditions=conditions), "ns"
        )
    elif podgroup:
        workload = wl.WorkloadV1Alpha1(
            {"name": name, "namespace": "ns"}, {"workers": wl.SchedulingPolicy(min_member)}
        )
        group = of_workload(workload, "ns", "workers")
    return Gang(
        f"ns/{name}",
        "ns",
        name,
        source if podgroup else pg.KOORDINATOR_SOURCE,
        group,
        problem,
        min_member,
        timeout,
        list(members),
        dict(holds or {}),
        generation,
        outcomes or Outcomes(),
        levels,
        problem_code,
    )


def gpus(*minors: int) -> DeviceAllocations:
    return DeviceAllocations({"gpu": [DeviceAllocation(minor=m) for m in minors]})


def request_of(m: MemberPod) -> PodRequest:
    res = {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}
    pod = {
        "metadata": {"name": m.name, "namespace": m.namespace, "uid": m.uid},
        "spec": {
            "containers": [{"name": "c", "resources": {"requests": res, "limits": res}}],
            "priority": m.priority,
        },
    }
    return pod_request(pod)


@dataclass
class FakePlanner:
    free: int = 0  # members that fit at once
    per_node: int = 2
    domain: str = ""
    victims: Collection[str] = ()  # keys of running pods whose removal makes room (when eligible)
    running_pods: list[Candidate] = field(default_factory=list)
    present: set[str] = field(default_factory=set)  # victims still bound and running
    nodes: dict[str, str] = field(default_factory=dict)  # pod key -> node (pod_nodes)
    shortage: Shortage | None = None
    gpus_free: int = 0
    refuse: set[str] = field(default_factory=set)
    missing: set[str] = field(default_factory=set)  # members the cache has not caught up with
    held: dict[str, Hold] = field(default_factory=dict)
    calls: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)
    reserved: list[HoldPlan] = field(default_factory=list)
    released: list[ReleaseHolds] = field(default_factory=list)
    levels_seen: list[Levels | None] = field(default_factory=list)  # what each plan was asked to keep to

    def called(self, name: str) -> list[tuple[Any, ...]]:
        return [args for n, args in self.calls if n == name]

    def requests(self, members: Sequence[MemberPod]) -> list[PodRequest]:
        return [request_of(m) for m in members if m.key not in self.missing]

    def admitting_nodes(self, members: Sequence[MemberPod]) -> list[str]:
        return ["n1", "n2", "n3"]

    def sibling_nodes(self, gang: str, members: Sequence[MemberPod]) -> dict[str, int]:
        return {}

    def running(self) -> list[Candidate]:
        return list(self.running_pods)

    def still_holding(self, victims: Iterable[Candidate]) -> list[Candidate]:
        return [v for v in victims if v.key in self.present]

    def pod_nodes(self, keys_: Iterable[str]) -> dict[str, str]:
        return {k: self.nodes[k] for k in keys_ if k in self.nodes}

    def _plan(self, requests: Sequence[PodRequest]) -> GangPlan:
        taken = len(self.held)
        placements = tuple(
            Placement(r.key, f"n{(taken + i) // self.per_node + 1}", Allocation(gpus(taken + i)))
            for i, r in enumerate(requests)
        )
        return GangPlan(placements, 100.0, self.domain)

    def plan_gang(
        self,
        requests: Sequence[PodRequest],
        *,
        siblings: Mapping[str, int],
        names: Iterable[str],
        levels: Levels | None = None,
    ) -> GangPlan | NoPlan:
        self.calls.append(("plan_gang", tuple(r.key for r in requests)))
        self.levels_seen.append(levels)
        if len(requests) > self.free:
            return NoPlan(f"only {self.free} of {len(requests)} members fit at once", self.free)
        return self._plan(requests)

    def plan_with_preemption(
        self,
        requests: Sequence[PodRequest],
        candidates: Iterable[Candidate],
        *,
        names: Iterable[str],
        siblings: Mapping[str, int],
        levels: Levels | None = None,
    ) -> PreemptionPlan | NoPlan:
        self.levels_seen.append(levels)
        pool = list(candidates)
        self.calls.append(("plan_with_preemption", tuple((c.key, c.priority) for c in pool)))
        own = sum(1 for r in requests if r.key in self.held)  # the members' own holds are no obstacle
        if len(requests) <= self.free + own:
            return PreemptionPlan(self._plan(requests), (), True)
        priority = min(r.priority for r in requests)
        chosen = tuple(c for c in pool if c.key in self.victims and c.priority < priority)
        if not chosen:
            return NoPlan("no room even after preempting every lower-priority pod")
        return PreemptionPlan(self._plan(requests), chosen, True)

    def min_resources_shortage(
        self, wanted: Mapping[str, Quantity], names: Iterable[str], removable: Collection[str]
    ) -> Shortage | None:
        self.calls.append(("min_resources_shortage", (tuple(sorted(removable)),)))
        return self.shortage

    def whole_gpus_free(self, names: Iterable[str]) -> int:
        return self.gpus_free

    def hold(self, plan: HoldPlan) -> bool:
        self.reserved.append(plan)
        made = []
        for hold in plan.holds:
            if hold.key in self.refuse or hold.key in self.held:
                for key in made:
                    del self.held[key]
                    self.free += 1
                return False
            self.held[hold.key] = hold
            self.free -= 1
            made.append(hold.key)
        return True

    def release(self, action: ReleaseHolds) -> None:
        self.released.append(action)
        for key in action.keys:
            if self.held.pop(key, None) is not None:
                self.free += 1


def run(
    g: Gang,
    planner: FakePlanner,
    state: Any = None,
    now: Clocks = NOW,
    *,
    rules: Rules | None = None,
    head: bool = True,
) -> Step:
    return step(g, state, now, planner, settings=rules or Rules(), head=head)


def kinds(actions: Iterable[Action]) -> list[str]:
    return [type(a).__name__ for a in actions]


def reports(actions: Iterable[Action]) -> list[tuple[str, str]]:
    return [(a.reason, a.note) for a in actions if isinstance(a, Event)]


def eviction(gang: str, victim: Candidate) -> Evict:
    """The gang's Evict of `victim`."""
    namespace, _, name = victim.key.partition("/")
    return Evict(ObjectRef(namespace, name, victim.uid), victim.node, owner=gang)


def pod_ref(m: MemberPod) -> ObjectRef:
    return ObjectRef(m.namespace, m.name, m.uid)


def ungate(m: MemberPod, gang: str = "ns/g") -> Ungate:
    """The gang's removal of its gate from member `m`."""
    return Ungate(pod_ref(m), keys.GANG_SCHEDULING_GATE, gang)


def nudge(m: MemberPod, node: str, gang: str = "ns/g") -> Nudge:
    return Nudge(pod_ref(m), node, gang)


def wake_at(gang: str, wall: float, now: Clocks = NOW) -> Requeue:
    """The Requeue that looks at `gang` again by the wall-clock time `wall`."""
    return Requeue(gang, max(0.0, wall - now.wall))


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == type_)
