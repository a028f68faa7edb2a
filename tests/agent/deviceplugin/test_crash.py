"""A killed agent never hands a GPU out twice (issue 32).

The real agent runs as its own process (fixture mode, device plugins on; started through the fork
server so that a restart costs a fraction of a second) and serves the stand-in kubelet, whose
device manager state and PodResources outlive the agent as kubelet's do. Each round admits a pod
holding one GPU whole, SIGKILLs the agent at a seeded random moment (mostly just after Allocate
answered, before any checkpoint, sometimes while a call is in flight), starts a new agent and lets
kubelet admit a pod whose annotation names the same GPU as a 50 % `gpu-core` share: kubelet counts
`nvidia.com/gpu` and `gpu-core` apart and offers it, so only the agent can refuse. The share must be
refused whenever the whole GPU was admitted, and admitted when it was not.

Each of the agent's two safeguards is tested alone in some rounds: the state directory wiped before
the restart (only kubelet's PodResources tells what was served), or PodResources down across the
restart (only the served journal does).
"""

from __future__ import annotations

import random
import shutil
import threading
import time
from collections.abc import Iterator

import pytest

from tests.agent.deviceplugin.rig import allocated, gpu_entry, pod_doc
from tests.support.agent_node import AgentNode
from tests.support.fakeapi import FakeApiServer
from tests.support.kubelet import AdmissionError, StandInKubelet

ROUNDS = 50
SEED = 3232
KILL_WINDOW = 0.03  # seconds after the whole-GPU pod's admission starts (it takes a few ms)


class Node(AgentNode):
    def __init__(self, server: FakeApiServer) -> None:
        super().__init__(server)
        self.refusals: list[str] = []

    def pod(self, name: str, limits: dict[str, str], annotation: str) -> dict:
        return self.put_pod(pod_doc(name, {"main": limits}, annotation))

    def admit(self, pod: dict) -> bool:
        """kubelet's admission; a refused pod is Failed, as kubelet's rejection makes it."""
        try:
            self.kubelet.admit(pod)
            return True
        except AdmissionError as exc:
            self.refusals.append(f"{pod['metadata']['name']}: {exc}")
            self.set_phase(pod["metadata"]["name"], "Failed")
            return False

    def finish(self, name: str) -> None:
        self.set_phase(name, "Succeeded")
        self.kubelet.release("default", name)


@pytest.fixture
def node(fake_api_thread: FakeApiServer) -> Iterator[Node]:
    node = Node(fake_api_thread)
    try:
        yield node
    finally:
        node.close()


def _held_twice(kubelet: StandInKubelet) -> list[str]:
    """GPUs kubelet holds for two pods at once: whole for one and any share for another."""
    whole: dict[str, str] = {}
    shared: dict[str, set[str]] = {}
    for pod, containers in kubelet.allocations.items():
        for got in containers.values():
            for uuid in got.get("nvidia.com/gpu", []):
                whole[uuid] = pod
            for unit in got.get("koordinator.sh/gpu-core", []):
                shared.setdefault(unit.rsplit("-u", 1)[0], set()).add(pod)
    return sorted(u for u, pod in whole.items() if shared.get(u, set()) - {pod})


def test_killed_agent_never_serves_a_gpu_twice(node: Node) -> None:
    rng = random.Random(SEED)
    node.start_agent()
    uuids = {minor: node.uuid(minor) for minor in range(8)}
    started = time.monotonic()
    outcomes = {"whole admitted": 0, "whole refused": 0}
    for i in range(ROUNDS):
        minor = i % 8
        uuid = uuids[minor]
        mode = rng.choice(("both", "both", "state dir lost", "no PodResources"))
        whole = node.pod(f"whole-{i}", {"nvidia.com/gpu": "1"}, allocated([gpu_entry(minor, uuid)]))
        killer = threading.Timer(rng.uniform(0, KILL_WINDOW), node.kill_agent)
        killer.start()
        whole_in = node.admit(whole)
        killer.join()
        outcomes["whole admitted" if whole_in else "whole refused"] += 1

        if mode == "state dir lost":
            shutil.rmtree(node.state, ignore_errors=True)
        if mode == "no PodResources":
            node.kubelet.stop_pod_resources()
        node.start_agent()
        share = node.pod(
            f"share-{i}",
            {"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"},
            allocated([gpu_entry(minor, uuid, core=50)]),
        )
        share_in = node.admit(share)
        if mode == "no PodResources":
            node.kubelet.start_pod_resources()

        where = f"round {i} ({mode}): whole {'admitted' if whole_in else 'refused'}; {node.refusals[-2:]}"
        assert not _held_twice(node.kubelet), where
        assert share_in != whole_in, where
        if whole_in:
            assert "already serve another pod" in node.refusals[-1], where
        for name, admitted in ((f"whole-{i}", whole_in), (f"share-{i}", share_in)):
            if admitted:
                node.finish(name)
    took = time.monotonic() - started
    # the kill points must cover both sides of the Allocate answer to mean anything
    assert outcomes["whole admitted"] >= ROUNDS // 2 and outcomes["whole refused"] >= 1, outcomes
    print(f"{ROUNDS} rounds in {took:.1f} s: {outcomes}")
