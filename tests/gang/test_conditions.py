"""PodGroup status conditions say why a gang waits: kubectl describe shows them."""

from __future__ import annotations

from tests.gang.harness import bound_elsewhere, condition, gang_world, gpu_node, member, node_of, podgroup
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Pki
from tests.support.polling import until


async def test_enough_gpus_in_the_wrong_shape_is_insufficient_topology(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    # Two nodes with 4 free GPUs each: 8 free, but a member needing 8 on one node fits nowhere.
    gpu_node(fake_api, "n1")
    gpu_node(fake_api, "n2")
    bound_elsewhere(fake_api, "a", "n1", [0, 1, 2, 3])
    bound_elsewhere(fake_api, "b", "n2", [4, 5, 6, 7])
    async with gang_world(fake_api, pki) as w:
        await w.admission.create_podgroup(podgroup("big", 1))
        await w.admission.create_pod(member("big0", group="big", gpus=8))
        await until(lambda: condition(w.podgroup_status("big"), "Waiting").get("status") == "True", 5)
        status = w.podgroup_status("big")
        waiting = condition(status, "Waiting")
        assert waiting["reason"] == "InsufficientTopology"
        assert waiting["message"].startswith("no placement for 1 more member(s) at once")
        assert condition(status, "Scheduled")["status"] == "False"
        assert condition(status, "Preempting")["status"] == "False"
        assert condition(status, "TimedOut")["status"] == "False"
        since = waiting["lastTransitionTime"]
        # Too few GPUs at all: another kind of wait; once room exists, Scheduled.
        await w.admission.create_podgroup(podgroup("huge", 1))
        await w.admission.create_pod(member("huge0", group="huge", gpus=8))
        await w.admission.create_pod(member("huge1", group="huge", gpus=8))
        await w.admission.delete_pod("a")
        await until(lambda: node_of(w.pods()["big0"]) == "n1", 10)
        await until(lambda: condition(w.podgroup_status("big"), "Scheduled").get("status") == "True", 5)
        after = w.podgroup_status("big")
        assert condition(after, "Waiting")["status"] == "False"
        assert condition(after, "Waiting")["lastTransitionTime"] >= since
        assert condition(after, "Scheduled")["reason"] == "MinMembersBound"
        # "huge" needs 16 GPUs; 4 are free: not a question of shape.
        await until(
            lambda: condition(w.podgroup_status("huge"), "Waiting").get("reason") == "InsufficientResources",
            5,
        )
