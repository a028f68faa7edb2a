"""GPU sets on the DGX-1 fixture (hybrid cube-mesh: pairs with two NVLinks, one, or none): the
Device CR the agent publishes for the fixture, read by the real inventory and allocator."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from agent.fixtures.composer import compose
from allocator.core.devices.allocate import Allocation, allocate
from allocator.core.node.state import NodeState
from allocator.core.request.parse import pod_request
from apis import keys
from tests.agent.support import FIXTURES, device_doc
from tests.core.nodes import state_of
from tests.core.pods import gpus, pod

GOLDEN = FIXTURES / "dgx1-v100" / "expected-device.yaml"


def _golden() -> dict:
    return yaml.safe_load(GOLDEN.read_text())


def _links(doc: dict) -> dict[frozenset[int], int]:
    out = {}
    for dev in doc["spec"]["devices"]:
        if dev["type"] == "gpu":
            for peer in dev.get("nvlink", {}).get("peers", []):
                out[frozenset((dev["minor"], peer["minor"]))] = peer["links"]
    return out


def _sockets(doc: dict) -> dict[int, int]:
    return {d["minor"]: d["topology"]["socketID"] for d in doc["spec"]["devices"] if d["type"] == "gpu"}


def _take(state: NodeState, n: int, name: str, annotations: dict | None = None) -> list[int]:
    req = pod_request(pod(gpus(n), name=name, annotations=annotations))
    result = allocate(state, req)
    assert isinstance(result, Allocation), result
    state.add_pod(f"default/{name}", result.devices)
    return result.minors("gpu")


def test_a_two_gpu_pod_on_an_empty_node_gets_a_double_linked_pair_on_one_socket() -> None:
    doc = _golden()
    state = state_of(doc)
    assert state.inventory is not None and state.inventory.gpu_sets
    got = _take(state, 2, "a")
    assert _links(doc)[frozenset(got)] == 2
    assert len({_sockets(doc)[m] for m in got}) == 1


def test_four_two_gpu_pods_get_the_four_double_linked_pairs_of_the_sockets() -> None:
    doc = _golden()
    state = state_of(doc)
    sets = [_take(state, 2, f"p{i}") for i in range(4)]
    assert sets == [[0, 3], [1, 2], [4, 7], [5, 6]]
    assert all(_links(doc)[frozenset(s)] == 2 for s in sets)


def test_four_and_eight_gpu_pods_get_their_best_sets() -> None:
    state = state_of(_golden())
    # a quad of one socket: every pair linked (the other fours have a pair without NVLink)
    assert _take(state, 4, "four") == [0, 1, 2, 3]
    assert _take(state, 4, "four-b") == [4, 5, 6, 7]
    assert _take(state_of(_golden()), 8, "eight") == list(range(8))


def test_three_gpus_without_a_partition_size_get_a_fully_linked_triangle() -> None:
    doc = _golden()
    got = _take(state_of(doc), 3, "three")
    pairs = [frozenset((a, b)) for a in got for b in got if a < b]
    assert all(_links(doc).get(p, 0) >= 1 for p in pairs)
    assert sum(_links(doc)[p] for p in pairs) == 5  # two double links and one single: the best


def test_a_pod_with_a_partition_spec_still_gets_a_table_partition() -> None:
    """Koordinator's rule: a gpu-partition-spec makes partitions mandatory; the agent's table for
    this machine holds the double-linked pairs."""
    state = state_of(_golden())
    spec = {keys.GPU_PARTITION_SPEC: {"allocatePolicy": "BestEffort"}}
    assert _take(state, 2, "spec", spec) == [0, 3]


@pytest.fixture()
def one_link_down(tmp_path: Path) -> dict:
    """The fixture with one of the two NVLinks between GPU0 and GPU3 reported down by NVML (both
    ends), composed and discovered by the real agent."""
    spec = yaml.safe_load((FIXTURES / "dgx1-v100" / "machine.yaml").read_text())
    bus = {g["index"]: g["bus"] for g in spec["nvml"]["gpus"]}
    for me, peer in ((0, 3), (3, 0)):
        targets = spec["nvml"]["gpus"][me]["nvlink"]["to"]
        for target in targets:
            if target["remote"] == bus[peer]:
                target["count"] = 1
        targets.append({"remote": bus[peer], "type": "gpu", "count": 1, "state": 0})
    folder = tmp_path / "dgx1-link-down"
    folder.mkdir()
    (folder / "machine.yaml").write_text(yaml.safe_dump(spec))
    compose(folder)
    return device_doc(folder)


def test_a_link_reported_down_moves_the_choice(one_link_down: dict) -> None:
    doc = one_link_down
    assert _links(doc)[frozenset((0, 3))] == 1  # the agent publishes the live count
    table = doc["metadata"]["annotations"][keys.GPU_PARTITIONS]
    assert '"minors":[0,3]' not in table  # nor is it a best-connected pair any more
    state = state_of(doc)
    got = _take(state, 2, "a")
    assert got == [2, 3] and _links(doc)[frozenset(got)] == 2
    assert len({_sockets(doc)[m] for m in got}) == 1


def test_single_gpus_leave_the_double_linked_pairs_whole() -> None:
    """Two 1-GPU pods take GPUs 0 and 1 (one switch, bin-packed); the next 2-GPU pod gets 2-3 on
    the same socket, where the table's first free partition (4-7) would break the other quad."""
    state = state_of(_golden())
    assert [_take(state, 1, "a"), _take(state, 1, "b"), _take(state, 2, "c")] == [[0], [1], [2, 3]]


def test_explain_lists_the_candidate_sets_and_their_objective() -> None:
    state = state_of(_golden())
    notes: list[str] = []
    result = allocate(state, pod_request(pod(gpus(2))), explain=notes)
    assert isinstance(result, Allocation) and result.path == "topology"
    text = "\n".join(notes)
    assert "GPU sets by interconnect (every set compared)" in text
    assert "GPUs 0, 3: bottleneck 50 GB/s NODE, total 50 GB/s; leaves 50 GB/s NODE, total 150 GB/s" in text
    assert "GPUs 0, 3 chosen by interconnect" in text
