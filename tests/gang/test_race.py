"""Two gangs racing for room that fits only one of them (the issue's deadlock case)."""

from __future__ import annotations

from apis import keys
from tests.gang.harness import gang_world, gates_of, gpu_node, member, node_of, podgroup
from tests.support.allocator_harness import double_booked
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Pki
from tests.support.polling import until


async def test_two_gangs_for_six_free_gpus_one_runs_the_other_waits_then_runs(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    gpu_node(fake_api, "n1")
    async with gang_world(fake_api, pki) as w:
        await w.admission.create_pod(member("other", gpus=2))  # an ordinary pod: 6 GPUs stay free
        await until(lambda: node_of(w.pods()["other"]) == "n1", 10)
        await w.admission.create_podgroup(podgroup("a", 4))
        await w.admission.create_podgroup(podgroup("b", 4))
        for i in range(4):  # interleaved, as two Jobs' pods would arrive
            await w.admission.create_pod(member(f"a{i}", group="a"))
            await w.admission.create_pod(member(f"b{i}", group="b"))

        def bound(prefix: str) -> int:
            return sum(1 for n, p in w.pods().items() if n.startswith(prefix) and node_of(p))

        await until(lambda: bound("a") + bound("b") == 4, 10)
        winner, loser = ("a", "b") if bound("a") == 4 else ("b", "a")
        assert bound(winner) == 4 and bound(loser) == 0  # one whole gang, nothing of the other
        await until(lambda: w.podgroup_status(winner).get("phase") == "Scheduled", 5)
        await until(lambda: w.podgroup_status(loser).get("phase") == "PreScheduling", 5)
        assert w.podgroup_status(loser).get("scheduled", 0) == 0
        assert all(
            gates_of(p) == [keys.GANG_SCHEDULING_GATE] for n, p in w.pods().items() if n.startswith(loser)
        )
        assert not [k for k in w.gang_reservations() if k.startswith(f"default/{loser}")]  # holds nothing
        await until(lambda: bool(w.events_about(loser, "PodGroup")), 5)
        notes = w.notes_about(loser, "PodGroup")
        assert any("no placement for 4 more member(s)" in n for n in notes), notes
        assert double_booked(w.fake.list_objects("pods", "default")) == []

        for i in range(4):  # the winner finishes
            await w.admission.delete_pod(f"{winner}{i}")
        await until(lambda: bound(loser) == 4, 10)
        await until(lambda: w.podgroup_status(loser).get("phase") == "Scheduled", 5)
        assert double_booked(w.fake.list_objects("pods", "default")) == []
        await until(lambda: w.gang_reservations() == {}, 5)  # all bound: no hold is left
