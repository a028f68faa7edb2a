"""A pod of one GPU scores where it would break a wholly free NVLink domain below where it would
not (scoring/topology.py, `BREAKS_DOMAIN`): on the A100 board with two NVLink pairs, the DGX H100
and a PCIe-only L40S, for whole GPUs and shares, and as the ranking sees it."""

from __future__ import annotations

import yaml

from allocator.core.request.parse import pod_request
from allocator.core.scoring.scorer import NodeScorer, ScoringConfig
from allocator.core.scoring.topology import BREAKS_DOMAIN, NVLINK, OPENS_DOMAIN, prepare_topology_grouped
from apis.annotations import DeviceAllocations
from tests.agent.support import FIXTURES
from tests.core.nodes import CORE, RATIO, cluster_of, state_of, use_gpus
from tests.core.pods import gpus, pod
from tests.support.allocations import entry
from tests.support.machines import dgx_h100_device, l40s_device

PAIRS = FIXTURES / "a100-pcie-4x-nvlink-pairs" / "expected-device.yaml"  # pairs 0-1 and 2-3


def _pairs(name: str = "n") -> dict:
    doc = yaml.safe_load(PAIRS.read_text())
    doc["metadata"]["name"] = name
    return doc


ONE = pod_request(pod(gpus(1)))
SHARE = pod_request(pod({"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}))


def _score(req: object, state: object) -> float | None:
    grouped = prepare_topology_grouped(req)  # type: ignore[arg-type]
    assert grouped is not None
    return grouped(state)  # type: ignore[arg-type]


def test_a_single_gpu_breaking_a_free_pair_scores_below_one_that_does_not() -> None:
    free = state_of(_pairs())
    assert _score(ONE, free) == BREAKS_DOMAIN  # both pairs whole: any GPU splits one
    broken = state_of(_pairs())
    use_gpus(broken, 0)  # pair 0-1 already split: GPU 1 costs nothing
    assert _score(ONE, broken) == NVLINK
    full_pair = state_of(_pairs())
    use_gpus(full_pair, 0, 1)  # pair 0-1 taken whole: only the free pair 2-3 is left to split
    assert _score(ONE, full_pair) == BREAKS_DOMAIN
    # no NVLink on the board: nothing to break; an untouched DGX is one domain of eight
    assert _score(ONE, state_of(l40s_device())) == NVLINK
    assert _score(ONE, state_of(dgx_h100_device())) == BREAKS_DOMAIN
    started = state_of(dgx_h100_device())
    use_gpus(started, 5)
    assert _score(ONE, started) == NVLINK


def test_a_share_goes_where_a_gpu_is_already_in_use() -> None:
    state = state_of(_pairs())
    assert _score(SHARE, state) == BREAKS_DOMAIN
    use_gpus(state, 2, share=40)  # a share on GPU 2: pair 2-3 is in use, the half fits there
    assert _score(SHARE, state) == NVLINK
    assert _score(ONE, state) == NVLINK  # GPU 3 is in a domain already in use too


def test_the_ranking_keeps_the_free_pairs_for_pods_that_use_them() -> None:
    """Two A100 pair boards, one with a pair already split: the 1-GPU pod goes there."""
    scorer = NodeScorer(ScoringConfig())
    for split in ("a", "b"):  # whichever name the tie would favour
        whole = "b" if split == "a" else "a"
        cluster = cluster_of(_pairs(whole), _pairs(split))
        cluster.assign("ns/one", split, DeviceAllocations({"gpu": [entry(0, {CORE: 100, RATIO: 100})]}), 0, 0)
        assert cluster.best(ONE, [whole, split], scorer) == split


def test_a_smaller_pod_packs_onto_the_board_in_use_and_a_whole_board_pod_loses_nothing() -> None:
    """Two DGX H100 (one NVLink domain of eight each), one with a GPU in use: a 2-GPU pod rates
    both NVLink but splits the untouched board's domain there, so it goes to the board in use,
    whichever name the tie would favour; an 8-GPU pod fills a domain and is not marked down."""
    two, eight = pod_request(pod(gpus(2))), pod_request(pod(gpus(8)))
    assert _score(two, state_of(dgx_h100_device())) == NVLINK - OPENS_DOMAIN
    assert _score(eight, state_of(dgx_h100_device())) == NVLINK
    scorer = NodeScorer(ScoringConfig())
    for used in ("a", "b"):
        fresh = "b" if used == "a" else "a"
        cluster = cluster_of(dgx_h100_device(fresh), dgx_h100_device(used))
        cluster.assign("ns/one", used, DeviceAllocations({"gpu": [entry(7, {CORE: 100, RATIO: 100})]}), 0, 0)
        assert cluster.best(two, [fresh, used], scorer) == used
