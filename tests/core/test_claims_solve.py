"""The devices for a pod's claims on one node and the node among several (allocator/core/claims/):
the core's own choice, bounded to what the node publishes and the selectors pass, handed out to
the requests and checked against every constraint. Pools come from the node side's slice builder
(agent/dra/slices.py) on recorded machines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.dra.slices import pool_devices, pool_slices
from allocator.core.claims.assign import satisfied
from allocator.core.claims.place import NoPlacement, place
from allocator.core.claims.published import NodeDevices, results_usage
from allocator.core.claims.published import pool_devices as node_pool
from allocator.core.claims.solve import NO_CANDIDATES, NOT_PUBLISHED, ClaimAnswer, solve
from allocator.core.cluster.state import ClusterState
from allocator.core.reasons import Rejection
from allocator.core.request.claims import PCIE_SWITCH, ClaimsRequest, translate
from allocator.core.request.parse import pod_request
from allocator.core.scoring.scorer import NodeScorer, ScoringConfig
from apis import dra
from apis.device import Device
from apis.dra_claims import DeviceClass, claim_spec
from apis.dra_slices import ResourceSlice
from tests.core.pods import pod

REPO = Path(__file__).resolve().parents[2]
CLASSES = {
    d["metadata"]["name"]: DeviceClass.from_dict(d)
    for d in yaml.safe_load_all((REPO / "deploy" / "dra" / "deviceclasses.yaml").read_text())
    if d
}
PAIR2 = "topoalloc.io/nvlinkPartition2"


def fixture_device(fixture: str, name: str) -> dict[str, Any]:
    obj = yaml.safe_load((REPO / "hw-fixtures" / fixture / "expected-device.yaml").read_text())
    obj["metadata"]["name"] = name
    return obj


def published(device: dict[str, Any], *, max_vfs: int = 8, drop: tuple[str, ...] = ()) -> NodeDevices:
    """The node's pool as its agent publishes it (the product name, which the agent reads from
    NVML, from the Device's GPU model label)."""
    name = device["metadata"]["name"]
    dev = Device.from_dict(device)
    model = dev.labels.get("node.koordinator.sh/gpu-model", "")
    products = {d.minor: f"NVIDIA {model}" for d in dev.devices if d.type == "gpu"}
    devices = [d for d in pool_devices(dev, products=products, max_vfs=max_vfs) if d["name"] not in drop]
    found = node_pool(name, [ResourceSlice.from_dict(s) for s in pool_slices(name, devices, 1)])
    assert found is not None
    return found


class Node:
    def __init__(self, fixture: str, name: str = "n1", **kwargs: Any) -> None:
        self.cluster = ClusterState()
        self.device = fixture_device(fixture, name)
        self.cluster.upsert_node(
            {
                "metadata": {"name": name},
                "status": {"allocatable": {"cpu": "64", "memory": "1Ti", "pods": "110"}},
            }
        )
        self.cluster.set_device(self.device)
        self.name = name
        self.pool = published(self.device, **kwargs)
        self.taken = 0

    @property
    def state(self) -> Any:
        return self.cluster.nodes[self.name]

    def solve(self, *claims: Any, explain: list[str] | None = None) -> ClaimAnswer | Rejection:
        return solve(self.state, creq(*claims), self.pool, explain=explain)

    def take(self, answer: ClaimAnswer | Rejection) -> None:
        assert isinstance(answer, ClaimAnswer), answer
        for key, usage in answer.usage.items():
            self.taken += 1
            self.cluster.assign(f"claim:{key}-{self.taken}", self.name, usage)


def creq(*claims: Any) -> ClaimsRequest:
    got = translate(pod_request(pod({"cpu": "1"})), [(f"ns/c{i}", c) for i, c in enumerate(claims)], CLASSES)
    assert isinstance(got, ClaimsRequest), got
    return got


def example(name: str) -> Any:
    tmpl = next(yaml.safe_load_all((REPO / "examples" / "dra" / f"{name}.yaml").read_text()))
    return claim_spec(tmpl["spec"]["spec"]["devices"], "spec.spec.devices")


def gpus(count: int, match: str = "", selectors: tuple[str, ...] = ()) -> Any:
    exactly: dict[str, Any] = {"deviceClassName": dra.GPU_CLASS, "count": count}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    devices: dict[str, Any] = {"requests": [{"name": "gpus", "exactly": exactly}]}
    if match:
        devices["constraints"] = [{"matchAttribute": match}]
    return claim_spec(devices, "")


def handed(answer: ClaimAnswer | Rejection, claim: str = "ns/c0") -> list[str]:
    assert isinstance(answer, ClaimAnswer), answer
    return [r.device for r in answer.results[claim]]


def attr(node: Node, device: str, name: str) -> Any:
    return node.pool.devices[device].attribute(name)


# -- quality: the core's choice, not first fit -------------------------------------------------------


def test_a_two_gpu_claim_gets_an_nvlink_pair_without_asking() -> None:
    node = Node("dgx1-v100")
    got = handed(node.solve(gpus(2)))
    # First fit would take gpu-0 and gpu-1 (one NVLink); the pairs of the table have two.
    assert attr(node, got[0], PAIR2) == attr(node, got[1], PAIR2)


GPU_FIXTURES = sorted(
    p.parent.name
    for p in (REPO / "hw-fixtures").glob("*/expected-device.yaml")
    if any(d["type"] == "gpu" for d in (yaml.safe_load(p.read_text()).get("spec") or {}).get("devices") or [])
)


@pytest.mark.parametrize("fixture", GPU_FIXTURES)
def test_the_nvlink_pair_example_never_gets_two_gpus_that_only_share_pcie(fixture: str) -> None:
    """examples/dra/nvlink-pair.yaml promises "never two GPUs that only reach each other over PCIe":
    on every recorded machine its claim gets two NVLink peers, or is refused with the reason."""
    node = Node(fixture)
    device = Device.from_dict(node.device)
    peers = {
        d.minor: {p.minor for p in d.nvlink.peers} for d in device.devices if d.type == "gpu" and d.nvlink
    }
    got = node.solve(example("nvlink-pair"))
    if any(peers.values()):
        a, b = sorted(int(name.removeprefix("gpu-")) for name in handed(got))
        assert b in peers[a], (fixture, a, b)
    else:
        assert isinstance(got, Rejection), (fixture, got)
        assert got.message == (
            "no published GPUs carry topoalloc.io/nvlinkPartition2: the node has no NVLink partition of 2 GPUs"
        )


def test_pairs_stay_intact_where_first_fit_would_break_them() -> None:
    node = Node("dgx1-v100")
    node.take(node.solve(gpus(1)))  # one GPU of some pair is taken
    answers = []
    for _ in range(3):
        answer = node.solve(example("nvlink-pair"))
        assert isinstance(answer, ClaimAnswer), answer
        node.take(answer)
        answers.append(handed(answer))
    for got in answers:
        assert attr(node, got[0], PAIR2) == attr(node, got[1], PAIR2)
    assert len({d for a in answers for d in a}) == 6
    assert isinstance(node.solve(example("nvlink-pair")), Rejection)  # the fourth pair is broken


def test_every_gpu_gets_the_nic_behind_its_switch() -> None:
    node = Node("dgx1-v100")  # two GPUs and one NIC per switch
    answer = node.solve(example("gpu-nic-x4"))
    got = handed(answer)
    pairs = list(zip(got[0::2], got[1::2], strict=True))
    assert all(attr(node, g, PCIE_SWITCH) == attr(node, n, PCIE_SWITCH) for g, n in pairs)
    assert len({attr(node, g, PCIE_SWITCH) for g, _ in pairs}) == 4
    assert [r.request for r in answer.results["ns/c0"]] == [
        "gpu-0",
        "nic-0",
        "gpu-1",
        "nic-1",
        "gpu-2",
        "nic-2",
        "gpu-3",
        "nic-3",
    ]


def test_a_gpu_and_a_published_vf_behind_one_switch() -> None:
    node = Node("dgx-h100", max_vfs=1)  # only each NIC's first VF is published
    gpu, vf = handed(node.solve(example("gpu-vf-same-switch")))
    assert attr(node, gpu, PCIE_SWITCH) == attr(node, vf, PCIE_SWITCH) and vf.endswith("-vf-0")


def test_eight_gpus_in_one_nvlink_domain() -> None:
    node = Node("dgx-h100")
    assert sorted(handed(node.solve(example("nvlink-domain-8")))) == [f"gpu-{m}" for m in range(8)]
    split = Node("a100-pcie-4x-nvlink-pairs")  # two domains of two
    got = split.solve(gpus(2, match="topoalloc.io/nvlinkDomain"))
    assert len({attr(split, d, "topoalloc.io/nvlinkDomain") for d in handed(got)}) == 1
    assert isinstance(split.solve(gpus(3, match="topoalloc.io/nvlinkDomain")), Rejection)


def test_a_regrouped_attribute_is_tried_value_by_value() -> None:
    node = Node("a100-pcie-4x-nvlink-pairs")
    node.take(node.solve(gpus(1)))
    # Three GPUs left over two domains: two of one domain exist only in the untouched one.
    got = node.solve(gpus(2, match="topoalloc.io/nvlinkDomain"))
    assert len({attr(node, d, "topoalloc.io/nvlinkDomain") for d in handed(got)}) == 1


# -- what bounds the choice ---------------------------------------------------------------------------


def test_an_unpublished_gpu_is_never_handed_out() -> None:
    node = Node("dgx-h100", drop=("gpu-0", "gpu-1"))
    got = handed(node.solve(gpus(4)))
    assert not {"gpu-0", "gpu-1"} & set(got)
    rej = node.solve(gpus(8))
    assert isinstance(rej, Rejection) and rej.code == NO_CANDIDATES


def test_selectors_choose_the_node_with_matching_devices() -> None:
    cluster = ClusterState()
    pools = {}
    for name, fixture in (("v100", "dgx1-v100"), ("h100", "dgx-h100")):
        dev = fixture_device(fixture, name)
        cluster.upsert_node(
            {
                "metadata": {"name": name},
                "status": {"allocatable": {"cpu": "64", "memory": "1Ti", "pods": "110"}},
            }
        )
        cluster.set_device(dev)
        pools[name] = published(dev)
    h100 = 'device.attributes["topoalloc.io"].productName.startsWith("NVIDIA H100")'
    got = place(
        cluster, creq(gpus(2, selectors=(h100,))), ["v100", "h100"], pools, NodeScorer(ScoringConfig()), None
    )
    assert isinstance(got, ClaimAnswer) and got.node == "h100"
    none = place(cluster, creq(gpus(9)), ["v100", "h100"], pools, NodeScorer(ScoringConfig()), None)
    assert isinstance(none, NoPlacement) and none.summary().startswith("0/2 nodes can take the claims")


def test_a_node_without_its_pool_or_attributes_is_refused_with_the_reason() -> None:
    node = Node("dgx-h100")
    rej = solve(node.state, creq(gpus(1)), None)
    assert isinstance(rej, Rejection) and rej.code == NOT_PUBLISHED
    no_attr = node.solve(gpus(2, match="topoalloc.io/notAnAttribute"))
    assert isinstance(no_attr, Rejection) and no_attr.code == NO_CANDIDATES


def test_constraints_the_chosen_devices_cannot_meet_are_refused_not_written() -> None:
    node = Node("dgx-h100")  # one GPU and one NIC behind each switch
    tmpl = claim_spec(
        {
            "requests": [
                {"name": "g", "exactly": {"deviceClassName": dra.GPU_CLASS, "count": 2}},
                {"name": "n", "exactly": {"deviceClassName": dra.RDMA_CLASS}},
            ],
            "constraints": [{"requests": ["g", "n"], "matchAttribute": PCIE_SWITCH}],
        },
        "",
    )
    got = node.solve(tmpl)
    # No switch has two GPUs: the core's own choice refuses it, nothing is handed out.
    assert isinstance(got, Rejection) and "Insufficient" in got.code, got


# -- results, usage, explanation ------------------------------------------------------------------------


def test_each_claim_gets_its_own_results_and_usage() -> None:
    node = Node("dgx-h100")
    answer = node.solve(gpus(1), gpus(1))
    assert isinstance(answer, ClaimAnswer)
    a, b = handed(answer, "ns/c0"), handed(answer, "ns/c1")
    assert len(a) == len(b) == 1 and a != b
    assert {r.pool for rs in answer.results.values() for r in rs} == {"n1"}
    assert [e.minor for e in answer.usage["ns/c0"]["gpu"]] == [int(a[0].split("-")[1])]
    assert satisfied(creq(gpus(1), gpus(1)), [a, b], node.pool.devices)


def test_results_of_any_allocator_read_back_as_usage() -> None:
    node = Node("dgx-h100")
    answer = node.solve(example("gpu-vf-same-switch"))
    assert isinstance(answer, ClaimAnswer)
    usage, missing = results_usage(node.state.inventory, "n1", answer.results["ns/c0"])
    assert missing == [] and usage.to_json() == answer.usage["ns/c0"].to_json()
    _, unknown = results_usage(
        node.state.inventory,
        "n1",
        [*answer.results["ns/c0"][:1], type(answer.results["ns/c0"][0])("x", dra.DRIVER, "n1", "gpu-99")],
    )
    assert unknown == ["gpu-99"]


def test_the_explanation_names_the_choice() -> None:
    node = Node("dgx1-v100")
    notes: list[str] = []
    node.solve(example("gpu-nic-x4"), explain=notes)
    assert any("GPUs capped per locality" in n for n in notes)  # the first try fails on this machine
    assert any(n.startswith("claim ns/c0, request nic-3: rdma-") for n in notes)


@pytest.mark.parametrize("fixture", ["dgx-h100", "dgx1-v100", "l40s-8x-pcie", "a100-pcie-4x-nvlink-pairs"])
def test_every_example_is_allocated_or_refused_never_wrong(fixture: str) -> None:
    for path in sorted((REPO / "examples" / "dra").glob("*.yaml")):
        node = Node(fixture)
        c = creq(example(path.stem))
        got = solve(node.state, c, node.pool)
        if isinstance(got, ClaimAnswer):
            handout = [[r.device for r in got.results["ns/c0"] if r.request == s.request] for s in c.slots]
            assert satisfied(c, handout, node.pool.devices), (fixture, path.stem)


def test_a_gpu_and_a_nic_unconstrained_still_sit_together() -> None:
    node = Node("dgx1-v100")
    plain = claim_spec(
        {
            "requests": [
                {"name": "g", "exactly": {"deviceClassName": dra.GPU_CLASS}},
                {"name": "n", "exactly": {"deviceClassName": dra.RDMA_CLASS}},
            ]
        },
        "",
    )
    for _ in range(4):  # first fit would pair gpu-1 with rdma-1 on another switch the second time
        answer = node.solve(plain)
        gpu, nic = handed(answer)
        assert attr(node, gpu, PCIE_SWITCH) == attr(node, nic, PCIE_SWITCH)
        node.take(answer)


def test_pairs_the_core_refuses_at_first_are_placed_by_the_retries() -> None:
    node = Node("dgx1-v100")
    c = creq(example("gpu-nic-x4"))
    _, failed = node.cluster.feasible(c.pod, ["n1"])
    assert "n1" in failed  # the joint allocation alone puts 4 GPUs on 2 switches with 2 NICs
    got = place(node.cluster, c, ["n1"], {"n1": node.pool}, NodeScorer(ScoringConfig()), None)
    assert isinstance(got, ClaimAnswer) and got.node == "n1"


# -- gangs of claims -------------------------------------------------------------------------------


def two_nodes() -> tuple[ClusterState, dict[str, NodeDevices]]:
    cluster = ClusterState()
    pools = {}
    for name in ("g1", "g2"):
        dev = fixture_device("dgx-h100", name)
        cluster.upsert_node(
            {
                "metadata": {"name": name},
                "status": {"allocatable": {"cpu": "64", "memory": "1Ti", "pods": "110"}},
            }
        )
        cluster.set_device(dev)
        pools[name] = published(dev)
    return cluster, pools


def member(name: str, count: int) -> ClaimsRequest:
    got = translate(pod_request(pod({"cpu": "1"}, name=name)), [(f"ns/{name}", gpus(count))], CLASSES)
    assert isinstance(got, ClaimsRequest)
    return got


def test_a_gang_of_claims_is_placed_whole_or_not_at_all() -> None:
    from allocator.core.claims.gang import place_gang
    from allocator.core.gang.plan import GangPlanSettings

    cluster, pools = two_nodes()
    scorer = NodeScorer(ScoringConfig())
    both = place_gang(
        cluster, [member("a", 8), member("b", 8)], ["g1", "g2"], pools, scorer, GangPlanSettings()
    )
    assert isinstance(both, list) and sorted(a.node for a in both) == ["g1", "g2"]
    assert [len(a.results[f"ns/{m}"]) for a, m in zip(both, "ab", strict=True)] == [8, 8]
    assert not cluster.nodes["g1"].pods  # nothing held: the caller holds what it is given
    three = place_gang(
        cluster, [member(m, 8) for m in "abc"], ["g1", "g2"], pools, scorer, GangPlanSettings()
    )
    assert isinstance(three, NoPlacement) and "does not fit whole" in three.summary()
    # Members of four share a node without sharing a GPU.
    four = place_gang(
        cluster, [member(m, 4) for m in "abcd"], ["g1", "g2"], pools, scorer, GangPlanSettings()
    )
    assert isinstance(four, list)
    for node in ("g1", "g2"):
        used = [r.device for a in four if a.node == node for rs in a.results.values() for r in rs]
        assert len(used) == len(set(used))
