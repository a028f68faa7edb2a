"""A watch cache that was blind while the cluster changed and whose resourceVersion was compacted
away relists (410 in either form), diffs, and ends equal to the API state."""

from __future__ import annotations

import asyncio

from tests.support.allocator_harness import (
    allocated,
    api_holdings,
    node_view,
    pod,
    rebuilt_from_api,
    running_allocator,
    seed_nodes,
)
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Pki
from tests.support.polling import until


async def test_compacted_watch_relists_and_converges(fake_api: FakeApiServer, pki: Pki) -> None:
    nodes = seed_nodes(fake_api, [f"gpu-{i}" for i in range(4)])
    pods = [fake_api.put(pod(f"w-{i}", gpus=2)) for i in range(8)]
    async with running_allocator(fake_api, pki) as run:
        for i, p in enumerate(pods):
            assert await run.client.bind(p, nodes[i % 4]) == ""
        await until(lambda: len(run.service.cache.holdings()) == 8 and not run.service.cache.ledger.holds)
        kinds = ("Node", "Device", "Pod")
        relists_before = {k: run.metric("topoalloc_cache_relists_total", {"kind": k, "cause": "expired"}) or 0
                          for k in kinds}  # fmt: skip

        # Blind the cache: every watch fails from now on.
        fake_api.inject_fault("GET", ".*", watch=True, status=500, times=None)
        fake_api.break_watches()
        await asyncio.sleep(0.2)
        # Meanwhile the cluster changes in every way the cache must notice:
        fake_api.remove("pods", "w-0", "default")  # a deletion (only a relist can tell)
        done = fake_api.get("pods", "w-1", "default")
        done["status"]["phase"] = "Succeeded"  # a finished pod releases its GPUs
        fake_api.put(done)
        other = pod("bound-elsewhere", gpus=1, node_name="gpu-3")
        other["metadata"]["annotations"] = {
            "scheduling.koordinator.sh/device-allocated": allocated(
                fake_api.get("pods", "w-3", "default")
            ).replace('"minor":', '"minor":1', 1)  # some other GPU of gpu-3, bound by another binder
        }
        fake_api.put(other)
        fake_api.remove("nodes", "gpu-2")  # a node and its pods' devices go away
        fake_api.remove("devices", "gpu-2")
        fake_api.compact()  # ...and the history to resume from is gone

        fake_api.clear_faults()
        # Each kind resumes, gets the 410 ERROR event, lists again and diffs.
        await until(
            lambda: all(
                (run.metric("topoalloc_cache_relists_total", {"kind": k, "cause": "expired"}) or 0)
                > relists_before[k]
                for k in kinds
            ),
            timeout=5,
        )
        stored = fake_api.list_objects("pods", "default")
        await until(
            lambda: run.service.cache.holdings() == api_holdings(fake_api.list_objects("pods", "default"))
        )
        assert (
            "default/w-0" not in run.service.cache.holdings()
            and "default/w-1" not in run.service.cache.holdings()
        )
        assert "default/bound-elsewhere" in run.service.cache.holdings()
        assert "gpu-2" not in run.service.cache.nodes
        assert node_view(run.service.core) == node_view(rebuilt_from_api(fake_api))
        # ...and it follows the watch again.
        fake_api.remove("pods", "w-4", "default")
        await until(lambda: "default/w-4" not in run.service.cache.holdings())
        assert len(stored) == 8
