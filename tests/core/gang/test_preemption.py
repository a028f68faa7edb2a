"""Device-aware, gang-aware victim selection (allocator/core/gang/preemption.py) on hand-built
nodes whose expected victims are worked out by hand from the machines' topology."""

from __future__ import annotations

from allocator.core.cluster.state import ClusterState
from allocator.core.gang.plan import GangPlan, GangPlanSettings, NoPlan, plan_gang
from allocator.core.gang.preemption import PreemptionPlan, node_victims, plan_with_preemption
from allocator.core.gang.victims import Budget, Candidate
from allocator.core.node.inventory import build_inventory
from allocator.core.node.state import NodeState
from allocator.core.request.parse import pod_request
from allocator.core.request.pod_request import PodRequest
from apis.annotations import DeviceAllocations
from tests.core.pods import gpus, hint, joint, pod
from tests.support.allocations import entry
from tests.support.machines import dgx_h100_device, l40s_device

CLIQUE = "nvidia.com/gpu.clique"
WHOLE = {"koordinator.sh/gpu-core": 100, "koordinator.sh/gpu-memory-ratio": 100}


def request(spec: dict[str, str], priority: int, name: str = "p", **extra: object) -> PodRequest:
    raw = pod(spec, name=name, **extra)  # type: ignore[arg-type]
    raw["spec"]["priority"] = priority
    return pod_request(raw)


def hold(state: NodeState, key: str, *minors: int) -> None:
    state.add_pod(key, DeviceAllocations({"gpu": [entry(m, WHOLE) for m in minors]}))


def l40s(name: str = "n") -> NodeState:
    return NodeState(name, build_inventory(l40s_device(name), {}), {})


def test_priority_comes_from_spec_priority() -> None:
    assert request(gpus(1), 1000).priority == 1000
    assert pod_request(pod(gpus(1))).priority == 0


def test_victims_must_free_one_pcie_switch_not_just_two_gpus() -> None:
    # L40S: GPUs pair up behind four PCIe switches (0-1, 2-3, 4-5, 6-7). Low-priority pods hold
    # GPUs 0, 2, 3 and 6; high-priority ones the rest. Two low-priority GPUs would do by count
    # (kube-scheduler's view), but only switch 1 (GPUs 2, 3) can be freed entirely.
    state = l40s()
    low = {"a/g0": 0, "a/g2": 2, "a/g3": 3, "a/g6": 6}
    for key, minor in low.items():
        hold(state, key, minor)
    for minor in (1, 4, 5, 7):
        hold(state, f"vip/g{minor}", minor)
    cands = [Candidate(k, "n", 0) for k in low] + [Candidate(f"vip/g{m}", "n", 100) for m in (1, 4, 5, 7)]
    req = request(gpus(2), 50, annotations=hint(gpu={"requiredTopologyScope": "PCIe"}))
    got = node_victims(state, req, cands)
    assert got is not None and got.exact
    assert sorted(v.key for v in got.victims) == ["a/g2", "a/g3"]
    assert got.allocation.minors("gpu") == [2, 3]
    # Once GPU 3 is held by an equal-priority pod, no switch can be freed: the node is dropped.
    state.remove_pod("a/g3")
    hold(state, "peer/g3", 3)
    cands = [c for c in cands if c.key != "a/g3"] + [Candidate("peer/g3", "n", 50)]
    assert node_victims(state, req, cands) is None


def test_a_joint_gpu_and_nic_pod_frees_a_gpu_beside_a_nic() -> None:
    # The L40S's NICs sit on switches 0 (GPUs 0-1) and 2 (GPUs 4-5). Every GPU is held; the
    # low-priority pods hold GPUs 0 and 2. Freeing GPU 2 (cheapest by name) gives a GPU with no
    # NIC on its switch, so only GPU 0's pod is a victim that works.
    state = l40s()
    hold(state, "a/on-2", 2)
    hold(state, "z/on-0", 0)
    for minor in (1, 3, 4, 5, 6, 7):
        hold(state, f"vip/g{minor}", minor)
    cands = [Candidate("a/on-2", "n", 0), Candidate("z/on-0", "n", 0)]
    cands += [Candidate(f"vip/g{m}", "n", 10) for m in (1, 3, 4, 5, 6, 7)]
    req = request({"nvidia.com/gpu": "1", "koordinator.sh/rdma": "1"}, 5, annotations=joint("gpu", "rdma"))
    got = node_victims(state, req, cands)
    assert got is not None and [v.key for v in got.victims] == ["z/on-0"]
    assert got.allocation.minors("gpu") == [0] and got.allocation.minors("rdma") == [0]


def test_a_running_gang_goes_whole_or_not_at_all() -> None:
    # A 2-member gang (2 GPUs each) and four 1-GPU pods share a DGX node; a pod needing 6 GPUs
    # can take the gang (2 pods) plus two fillers (4 pods in all), or four fillers and... not
    # enough without the gang. Each gang member alone would be cheaper but is never offered.
    state = NodeState("n", build_inventory(dgx_h100_device("n"), {}), {})
    hold(state, "job/w0", 0, 1)
    hold(state, "job/w1", 2, 3)
    for minor in (4, 5, 6, 7):
        hold(state, f"f/p{minor}", minor)
    cands = [Candidate("job/w0", "n", 0, gang="job/g"), Candidate("job/w1", "n", 0, gang="job/g")]
    cands += [Candidate(f"f/p{m}", "n", 0) for m in (4, 5, 6, 7)]
    got = node_victims(state, request(gpus(6), 9), cands)
    assert got is not None
    keys = sorted(v.key for v in got.victims)
    assert {"job/w0", "job/w1"} <= set(keys) and len(keys) == 4
    # Needing 3 GPUs: three fillers (3 pods) beat the gang (2 pods, 4 GPUs)? No: fewer pods win,
    # and the gang is 2 pods, so the whole gang goes and no member is ever taken alone.
    got = node_victims(state, request(gpus(3), 9), cands)
    assert got is not None and sorted(v.key for v in got.victims) == ["job/w0", "job/w1"]
    # A gang with a member on another node cannot be named by this node's answer.
    spread = [*cands, Candidate("job/w9", "m", 0, gang="job/g")]
    got = node_victims(state, request(gpus(6), 9), spread)
    assert got is None


def test_equal_priority_is_never_preempted() -> None:
    state = l40s()
    for minor in range(8):
        hold(state, f"f/p{minor}", minor)
    cands = [Candidate(f"f/p{m}", "n", 7) for m in range(8)]
    assert node_victims(state, request(gpus(1), 7), cands) is None
    got = node_victims(state, request(gpus(1), 8), cands)
    assert got is not None and [v.key for v in got.victims] == ["f/p0"]


def clique_cluster(per_clique: dict[str, int]) -> ClusterState:
    """DGX H100 nodes `<clique>-<i>`, each labelled with its NVLink clique, every GPU held by a
    1-GPU pod of priority 0 (`f/<node>-<minor>`)."""
    c = ClusterState()
    for clique, count in per_clique.items():
        for i in range(count):
            name = f"{clique}-{i}"
            c.upsert_node({"metadata": {"name": name, "labels": {CLIQUE: clique}}, "status": {}})
            c.set_device(dgx_h100_device(name))
            for m in range(8):
                allocs = DeviceAllocations({"gpu": [entry(m, WHOLE)]})
                c.assign(f"f/{name}-{m}", name, allocs)
    return c


def fillers(c: ClusterState, priority: int = 0) -> list[Candidate]:
    return [Candidate(k, n, priority) for k, n in sorted(c.pod_node.items())]


def test_a_four_by_eight_gang_evicts_exactly_one_nvlink_domain() -> None:
    # Clique a: 3 nodes, clique b: 4 nodes, clique c: 5 nodes, all full of 1-GPU pods. The gang
    # needs 4 whole nodes in one clique: 32 victims. By count any 32 pods would do; the plan takes
    # four nodes of one clique, nothing elsewhere (c: the planner tries the roomiest domain first,
    # and b's four nodes would be no better).
    c = clique_cluster({"a": 3, "b": 4, "c": 5})
    members = [request(gpus(8), 1000, name=f"w{i}") for i in range(4)]
    got = plan_with_preemption(c, members, fillers(c), GangPlanSettings(topology_keys=(CLIQUE,)))
    assert isinstance(got, PreemptionPlan)
    assert len(got.victims) == 32
    nodes = got.victim_nodes
    assert len(nodes) == 4 and {n.split("-")[0] for n in nodes} == {"c"}
    assert got.plan.nodes == nodes and got.plan.domain == f"{CLIQUE}={nodes[0].split('-')[0]}"
    assert not any(k.startswith("f/") for k in (p.key for p in got.plan.placements))
    assert all(state.pod_count == 8 for state in c.nodes.values())  # the cluster itself is untouched


def test_a_gang_that_fits_preempts_nothing_and_one_that_cannot_says_so() -> None:
    c = clique_cluster({"a": 1})
    c.nodes["a-0"].remove_pod("f/a-0-0")
    c.pod_node.pop("f/a-0-0")
    got = plan_with_preemption(c, [request(gpus(1), 5)], fillers(c))
    assert isinstance(got, PreemptionPlan) and got.victims == ()
    # 9 GPUs on one 8-GPU node: no victim set helps.
    far = plan_with_preemption(c, [request(gpus(8), 5, name="a"), request(gpus(1), 5, name="b")], fillers(c))
    assert isinstance(far, NoPlan) and far.message.startswith("no room even after preempting")
    # Equal priority: nothing is eligible, the planner's own reason stands.
    same = plan_with_preemption(c, [request(gpus(2), 0)], fillers(c, 0))
    assert isinstance(same, NoPlan) and not same.message.startswith("no room even")


def test_over_budget_the_fallback_keeps_one_domain_and_spares_what_is_not_needed() -> None:
    # Forced fallback (no exact search): the result still fits, stays in one clique, and no
    # victim can be spared.
    c = clique_cluster({"a": 2, "b": 3})
    c.nodes["b-2"].remove_pod("f/b-2-0")
    c.pod_node.pop("f/b-2-0")
    members = [request(gpus(4), 9, name=f"w{i}") for i in range(3)]
    settings = GangPlanSettings(topology_keys=(CLIQUE,))
    got = plan_with_preemption(c, members, fillers(c), settings, budget=Budget(0, 0))
    assert isinstance(got, PreemptionPlan) and not got.exact
    assert len({n.split("-")[0] for n in got.plan.nodes}) == 1
    victims = {v.key for v in got.victims}
    for spared in sorted(victims):
        trial = clique_cluster({"a": 2, "b": 3})
        for key in victims - {spared} | {"f/b-2-0"}:
            trial.unassign(key)
        assert isinstance(plan_gang(trial, members, settings, names=got.plan.nodes), NoPlan)
    assert isinstance(got.plan, GangPlan)
