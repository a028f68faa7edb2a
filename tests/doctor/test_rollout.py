"""`install --wait`: a Deployment and a DaemonSet judged rolled out as `kubectl rollout status`
judges them; the wait says what it waits for as it changes and fails naming what is left once the
time is up; doctor is asked again while a check fails, within the time left."""

from __future__ import annotations

from typing import Any

import pytest

from topoalloc.commands.doctor.findings import fail, ok
from topoalloc.commands.doctor.rollout import pending, settle, wait_rollout
from topoalloc.errors import Failure


def deployment(**status: int) -> dict[str, Any]:
    return {
        "kind": "Deployment",
        "metadata": {"name": "topoalloc-allocator", "namespace": "topoalloc-system", "generation": 2},
        "spec": {"replicas": 2},
        "status": {"observedGeneration": 2, **status},
    }


def daemonset(**status: int) -> dict[str, Any]:
    return {
        "kind": "DaemonSet",
        "metadata": {"name": "topoalloc-agent", "namespace": "topoalloc-system", "generation": 1},
        "spec": {},
        "status": {"observedGeneration": 1, **status},
    }


def test_a_deployment_rolls_out_when_every_replica_is_updated_and_available() -> None:
    assert (
        pending({**deployment(), "status": {"observedGeneration": 1}})
        == "its controller has not seen the new spec yet"
    )
    assert pending(deployment(updatedReplicas=1, replicas=2)) == "1 of 2 replicas updated"
    assert (
        pending(deployment(updatedReplicas=2, replicas=3, availableReplicas=2))
        == "1 old replica(s) still terminating"
    )
    assert (
        pending(deployment(updatedReplicas=2, replicas=2, availableReplicas=1))
        == "1 of 2 updated replicas available"
    )
    assert pending(deployment(updatedReplicas=2, replicas=2, availableReplicas=2)) == ""
    scaled = deployment()
    scaled["spec"]["replicas"] = 0
    assert pending(scaled) == ""


def test_a_daemonset_rolls_out_when_every_node_runs_an_available_updated_pod() -> None:
    assert pending(daemonset(desiredNumberScheduled=2, updatedNumberScheduled=1)) == "1 of 2 pods updated"
    assert pending(daemonset(desiredNumberScheduled=2, updatedNumberScheduled=2, numberAvailable=1)) == (
        "1 of 2 updated pods available"
    )
    assert pending(daemonset(desiredNumberScheduled=2, updatedNumberScheduled=2, numberAvailable=2)) == ""


class Cluster:
    """What the wait reads: each workload's state, one per look."""

    def __init__(self, states: dict[str, list[dict[str, Any]]]) -> None:
        self.states = states

    def doc_path(self, doc: dict[str, Any]) -> str:
        return doc["metadata"]["name"]

    def get(self, path: str) -> dict[str, Any]:
        seen = self.states[path]
        return seen.pop(0) if len(seen) > 1 else seen[0]


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


def test_the_wait_says_what_it_waits_for_and_returns_the_time_left() -> None:
    cluster = Cluster(
        {
            "topoalloc-allocator": [
                deployment(updatedReplicas=1, replicas=2),
                deployment(updatedReplicas=2, replicas=2, availableReplicas=2),
            ],
            "topoalloc-agent": [
                daemonset(desiredNumberScheduled=1, updatedNumberScheduled=1, numberAvailable=1)
            ],
        }
    )
    said: list[str] = []
    clock = Clock()
    left = wait_rollout(
        cluster,
        [deployment(), daemonset(), {"kind": "ConfigMap"}],
        60,
        said.append,
        clock=clock,
        sleep=clock.sleep,
    )
    assert said == [
        "waiting for Deployment topoalloc-system/topoalloc-allocator: 1 of 2 replicas updated",
        "Deployment topoalloc-system/topoalloc-allocator rolled out",
    ]
    assert left == 58.0


def test_the_wait_fails_naming_what_did_not_roll_out() -> None:
    cluster = Cluster(
        {"topoalloc-allocator": [deployment(updatedReplicas=2, replicas=2, availableReplicas=0)]}
    )
    clock = Clock()
    with pytest.raises(Failure) as failed:
        wait_rollout(cluster, [deployment()], 10, lambda _: None, clock=clock, sleep=clock.sleep)
    assert str(failed.value.message) == (
        "rollout (10 s): not done: Deployment topoalloc-system/topoalloc-allocator: 0 of 2 updated replicas available"
    )


def test_doctor_is_asked_again_while_a_check_fails_and_the_time_lasts() -> None:
    looks = [[fail("agents", "no Device yet", "wait")], [ok("agents", "fine")]]
    clock = Clock()
    _, findings = settle(lambda: (None, looks.pop(0)), 30, clock=clock, sleep=clock.sleep)
    assert findings[0].status == "ok" and clock.t == 2.0
    clock = Clock()
    _, findings = settle(lambda: (None, [fail("agents", "stale", "x")]), 5, clock=clock, sleep=clock.sleep)
    assert findings[0].status == "fail" and clock.t == 6.0
