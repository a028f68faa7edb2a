"""The write of the node's choice into the pod (agent/deviceplugin/node_writes.py), pass by pass on
a hand-moved clock: retried with backoff until it lands, dropped when the pod is gone, not made
again when the pod already carries it."""

from __future__ import annotations

import json
from typing import Any

from kubernetes.client.exceptions import ApiException

from agent.deviceplugin.node_writes import RETRY_FIRST, NodeWrites
from agent.deviceplugin.served import ServedPod
from apis import keys

ENTRY = {"minor": 3, "resources": {"koordinator.sh/gpu-core": "100"}, "id": "GPU-3"}
WANT = '{"gpu":[{"minor":3,"resources":{"koordinator.sh/gpu-core":"100"},"id":"GPU-3"}]}'


class Notes:
    def __init__(self) -> None:
        self.normal: list[tuple[str, str, str]] = []

    def warn(self, pod: dict[str, Any], reason: str, message: str) -> None:
        raise AssertionError("no Warning expected")

    def note(self, pod: dict[str, Any], reason: str, message: str) -> None:
        self.normal.append((pod["metadata"]["uid"], reason, message))


def writes(
    answers: list[Any], pods: list[dict[str, Any]] | None = None
) -> tuple[NodeWrites, list, Notes, list]:
    """A writer over one served pod (uid u1) whose patches answer `answers` in turn (200: lands; a
    status, or a status and its body)."""
    served = ServedPod("ns", "p")
    served.record("nvidia.com/gpu", 0, ["GPU-3"])
    served.chose("nvidia.com/gpu", 0, [ENTRY], "it has no annotation")
    patches: list[tuple[str, str, str, dict[str, str]]] = []
    now = [100.0]

    def patch(namespace: str, name: str, uid: str, annotations: dict[str, str]) -> None:
        patches.append((namespace, name, uid, annotations))
        status, body = (answers.pop(0), None) if isinstance(answers[0], int) else answers.pop(0)
        if status != 200:
            exc = ApiException(status=status, reason="injected")
            exc.body = body
            raise exc

    notes = Notes()
    writer = NodeWrites(
        node="n1",
        served=lambda: {"u1": served},
        pods=lambda: pods,
        patch=patch,
        events=notes,
        clock=lambda: now[0],
    )
    return writer, patches, notes, now


def test_a_failed_write_is_retried_with_backoff_until_it_lands() -> None:
    writer, patches, notes, now = writes([503, 500, 200])
    assert writer.write_pass() == RETRY_FIRST and writer.pending() == 1
    assert patches == [("ns", "p", "u1", {keys.DEVICE_ALLOCATED: WANT, keys.ALLOCATED_NODE: "n1"})]
    assert writer.write_pass() is not None and len(patches) == 1  # not due yet
    now[0] += RETRY_FIRST
    assert writer.write_pass() == 2 * RETRY_FIRST and len(patches) == 2  # doubled
    assert notes.normal == []
    now[0] += 2 * RETRY_FIRST
    assert writer.write_pass() is None and writer.pending() == 0 and len(patches) == 3
    assert notes.normal == [
        (
            "u1",
            "DevicesChosenOnNode",
            "No device allocation for node n1 (it has no annotation): the node chose GPU 3 (GPU-3)",
        )
    ]
    writer.write_pass()
    assert len(patches) == 3 and len(notes.normal) == 1  # written: nothing more


def invalid(field: str) -> tuple[int, str]:
    """kube-apiserver's 422 refusing a change of `field` (as it answers a patch naming the uid of
    another pod of that name: tests/cluster/test_fake_parity.py)."""
    causes = [{"reason": "FieldValueInvalid", "message": "field is immutable", "field": field}]
    return 422, json.dumps({"kind": "Status", "code": 422, "details": {"causes": causes}})


def test_a_pod_gone_or_replaced_is_not_written_again() -> None:
    # deleted; another pod of that name (the uid a precondition: 409; the uid of a patch: 422)
    for answer in (404, 409, invalid("metadata.uid")):
        writer, patches, notes, _ = writes([answer])
        assert writer.write_pass() is None and writer.pending() == 0
        writer.write_pass()
        assert len(patches) == 1 and notes.normal == []
    # Refused for anything else: tried again.
    writer, patches, _, _ = writes([invalid("metadata.annotations")])
    assert writer.write_pass() == RETRY_FIRST and writer.pending() == 1


def test_a_pod_that_already_carries_the_choice_is_left_alone() -> None:
    pod = {"metadata": {"uid": "u1", "annotations": {keys.DEVICE_ALLOCATED: WANT, keys.ALLOCATED_NODE: "n1"}}}
    writer, patches, notes, _ = writes([], [pod])
    assert writer.write_pass() is None
    assert patches == [] and notes.normal == []
    # the same devices, but the annotation still names another node: written
    pod["metadata"]["annotations"][keys.ALLOCATED_NODE] = "n2"
    writer, patches, _, _ = writes([200], [pod])
    writer.write_pass()
    assert len(patches) == 1
