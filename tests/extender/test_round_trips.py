"""`roundTrips: 1`: filter answers with the node prioritize would rank first, alone, so that
kube-scheduler places the pod without scoring and never calls prioritize (docs/service.md, "Round
trips"); `roundTrips: 2`: filter passes every node that fits. The same real allocator, over mTLS,
fed by the fake API server."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from allocator.runtime.config import ServiceConfig
from tests.support.allocator_harness import Running, pod, running_allocator, seed_nodes
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Pki
from topoalloc.cli import main


async def busy(run: Running, fake_api: FakeApiServer, node: str, gpus: int, name: str) -> None:
    """A pod bound to `node` through the allocator, holding `gpus` GPUs: the nodes differ."""
    assert await run.client.bind(fake_api.put(pod(name, gpus=gpus)), node) == ""


async def test_one_trip_filter_passes_the_node_prioritize_ranks_first_alone(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    names = seed_nodes(fake_api, ["gpu-1", "gpu-2", "gpu-3"]) + seed_nodes(fake_api, ["l40s-1"], kind="l40s")
    asks = [fake_api.put(pod(f"p{gpus}", gpus=gpus)) for gpus in (1, 2, 4, 8)]
    async with running_allocator(fake_api, pki, round_trips=1) as run:
        await busy(run, fake_api, "gpu-2", 2, "tenant-a")
        await busy(run, fake_api, "gpu-3", 4, "tenant-b")
        chosen = set()
        for p in asks:
            fits = run.service.core.filter_nodes(run.service.core.request(p), names).passed
            assert len(fits) >= 2, p["metadata"]["name"]  # otherwise there is nothing to choose
            scores = await run.client.prioritize(p, fits)
            (best,) = [n for n, s in scores.items() if s == 10]
            for order in (names, names[::-1]):
                result = await run.client.filter(p, order)
                assert result["NodeNames"] == [best], (p["metadata"]["name"], scores)
                # The nodes that do not fit keep their reasons; the others that fit are left out.
                rejected = {**result["FailedNodes"], **result["FailedAndUnresolvableNodes"]}
                assert set(rejected) == set(names) - set(fits)
            chosen.add(best)
        assert len(chosen) >= 2  # the choice follows the pod, not the order of the names
        # kube-scheduler's NodeList form (nodeCacheCapable: false): the one item, unchanged.
        items = [fake_api.get("nodes", n) for n in names]
        status, reply = await run.client.post(
            "filter", {"Pod": asks[0], "Nodes": {"metadata": {}, "items": items}, "NodeNames": None}
        )
        assert status == 200 and reply["NodeNames"] is None
        assert [n["metadata"]["name"] for n in reply["Nodes"]["items"]] == (
            await run.client.filter(asks[0], names)
        )["NodeNames"]


async def test_two_trips_filter_passes_every_node_that_fits(fake_api: FakeApiServer, pki: Pki) -> None:
    names = seed_nodes(fake_api, ["gpu-1", "gpu-2", "gpu-3"])
    four = fake_api.put(pod("four", gpus=4))
    async with running_allocator(fake_api, pki, round_trips=2) as run:
        await busy(run, fake_api, "gpu-3", 8, "tenant")
        result = await run.client.filter(four, names)
        assert result["NodeNames"] == ["gpu-1", "gpu-2"] and set(result["FailedNodes"]) == {"gpu-3"}


@pytest.mark.parametrize("round_trips", [1, 2])
async def test_pods_that_fit_nowhere_or_ask_no_devices_are_answered_alike(
    fake_api: FakeApiServer, pki: Pki, round_trips: int
) -> None:
    names = seed_nodes(fake_api, ["gpu-1", "gpu-2"])
    plain = fake_api.put(pod("plain"))
    big = fake_api.put(pod("too-big", gpus=16))
    async with running_allocator(fake_api, pki, round_trips=round_trips) as run:
        result = await run.client.filter(plain, [*names, "cpu-only"])
        assert result["NodeNames"] == [*names, "cpu-only"]  # kube-scheduler's own plugins rank these
        result = await run.client.filter(big, names)
        assert result["NodeNames"] == []
        assert set(result["FailedNodes"]) | set(result["FailedAndUnresolvableNodes"]) == set(names)


async def test_one_trip_binds_where_filter_pointed(fake_api: FakeApiServer, pki: Pki) -> None:
    """kube-scheduler's one-trip cycle: filter, then bind to the one node passed."""
    names = seed_nodes(fake_api, [f"gpu-{i}" for i in range(4)])
    pods = [fake_api.put(pod(f"w{i}", gpus=(1, 2, 4)[i % 3])) for i in range(8)]
    async with running_allocator(fake_api, pki, round_trips=1) as run:
        for p in pods:
            result = await run.client.filter(p, names)
            assert len(result["NodeNames"]) == 1, result
            (node,) = result["NodeNames"]
            assert await run.client.bind(p, node) == ""
        placed = {fake_api.get("pods", p["metadata"]["name"], "default")["spec"]["nodeName"] for p in pods}
        # 17 GPUs on four 8-GPU nodes: the ranking fills nodes rather than spreading.
        assert len(placed) == 3
        assert run.metric("topoalloc_extender_requests_total", {"verb": "prioritize", "result": "ok"}) is None


def test_round_trips_setting_file_flag_and_bad_values(tmp_path: Path) -> None:
    assert ServiceConfig().round_trips == 1
    path = tmp_path / "allocator.yaml"
    path.write_text(yaml.safe_dump({"roundTrips": 2}))
    assert ServiceConfig.load(path).round_trips == 2
    assert ServiceConfig.load(path).updated(round_trips=1).round_trips == 1
    runner = CliRunner()
    for bad in ("roundTrips: 3\n", "roundTrips: true\n", "roundTrips: one\n"):
        path.write_text(bad)
        result = runner.invoke(main, ["allocator", "--config", str(path)])
        assert result.exit_code == 2 and "roundTrips" in result.output, (bad, result.output)
    result = runner.invoke(main, ["allocator", "--round-trips", "3"])
    assert result.exit_code == 2 and "--round-trips" in result.output
