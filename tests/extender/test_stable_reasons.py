"""What kube-scheduler aggregates stays one reason per cause: nodes short of GPUs by different
amounts give the same FailedNodes text; the pod's Event says what one such node has left."""

from __future__ import annotations

from tests.gang.harness import bound_elsewhere, gpu_node, member
from tests.support.allocator_harness import running_allocator
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Pki
from tests.support.polling import until


async def test_failed_nodes_share_one_message_and_the_event_has_the_details(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    for name in ("n1", "n2", "n3"):
        gpu_node(fake_api, name, kind="l40s")  # partitions preferred, not required
    bound_elsewhere(fake_api, "a", "n1", [0, 1, 2])  # 5 free
    bound_elsewhere(fake_api, "b", "n2", [0, 1, 2, 3, 4])  # 3 free
    bound_elsewhere(fake_api, "c", "n3", [0])  # 7 free
    async with running_allocator(fake_api, pki) as r:
        pod = member("wide", gpus=8)
        pod["metadata"]["uid"] = "u-wide"
        reply = await r.client.filter(pod, ["n1", "n2", "n3"])
        assert reply["NodeNames"] == []
        assert set(reply["FailedNodes"].values()) == {"need 8 free GPUs"}
        assert reply["FailedAndUnresolvableNodes"] == {}

        def notes() -> list[str]:
            return [
                e.get("note") or e.get("message") or "" for e in fake_api.list_objects("events", "default")
            ]

        await until(lambda: any("nodes can host" in n for n in notes()), 5)
        (note,) = [n for n in notes() if "nodes can host" in n]
        assert note == "0/3 nodes can host the pod's devices: 3 need 8 free GPUs (e.g. n1: 5 are free)"
