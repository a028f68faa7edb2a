"""Pod rules: scheduling gates, what an update may change, defaults, names, and binding refusals."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from tests.support.fakeapi import FakeApiServer
from tests.support.fakeapi.pods import qos_class

from .manifests import pod


async def _error(call: Any) -> tuple[int, dict[str, Any]]:
    with pytest.raises(ApiException) as err:
        await call
    return err.value.status, json.loads(err.value.body)


def _gate_message(name: str, gate: str, index: int = 0) -> str:
    return (
        f'Pod "{name}" is invalid: spec.schedulingGates[{index}].name: Forbidden: only deletion is allowed, '
        f"but found new scheduling gate '{gate}'"
    )


async def test_scheduling_gates_can_only_be_removed(fake_api_aio_client: Any) -> None:
    core = client.CoreV1Api(fake_api_aio_client)
    await core.create_namespaced_pod("default", pod("g", gates=["example.com/wait", "example.com/quota"]))
    await core.create_namespaced_pod("default", pod("u"))

    status, body = await _error(
        core.patch_namespaced_pod("u", "default", {"spec": {"schedulingGates": [{"name": "x/late"}]}})
    )
    assert (status, body["message"]) == (422, _gate_message("u", "x/late"))
    status, body = await _error(
        core.patch_namespaced_pod(
            "u", "default", [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": "x/late"}]}]
        )
    )
    assert (status, body["details"]["causes"][0]["field"]) == (422, "spec.schedulingGates[0].name")

    # Removing one gate through a JSON patch is fine; the pod stays gated by the other.
    removed = await core.patch_namespaced_pod(
        "g", "default", [{"op": "remove", "path": "/spec/schedulingGates/0"}]
    )
    assert [g.name for g in removed.spec.scheduling_gates] == ["example.com/quota"]
    status, body = await _error(
        core.patch_namespaced_pod(
            "g", "default", {"spec": {"schedulingGates": [{"name": "example.com/wait"}]}}
        )
    )
    assert (status, body["message"]) == (422, _gate_message("g", "example.com/wait"))
    ungated = await core.patch_namespaced_pod(
        "g", "default", {"spec": {"schedulingGates": None}}, _content_type="application/merge-patch+json"
    )
    assert ungated.spec.scheduling_gates is None


async def test_gated_pods_start_with_a_scheduling_gated_condition(fake_api_aio_client: Any) -> None:
    core = client.CoreV1Api(fake_api_aio_client)
    gated = await core.create_namespaced_pod("default", pod("g", gates=["x/wait"]))
    [condition] = gated.status.conditions
    assert (condition.type, condition.status, condition.reason) == (
        "PodScheduled",
        "False",
        "SchedulingGated",
    )
    plain = await core.create_namespaced_pod("default", pod("p"))
    assert plain.status.conditions is None


async def test_pod_spec_is_immutable_except_images_and_friends(fake_api_aio_client: Any) -> None:
    core = client.CoreV1Api(fake_api_aio_client)
    await core.create_namespaced_pod("default", pod("p"))
    new_image = await core.patch_namespaced_pod(
        "p", "default", {"spec": {"containers": [{"name": "main", "image": "registry.invalid/cuda:13"}]}}
    )
    assert new_image.spec.containers[0].image == "registry.invalid/cuda:13"
    status, body = await _error(core.patch_namespaced_pod("p", "default", {"spec": {"nodeName": "n1"}}))
    assert status == 422
    assert body["message"].startswith(
        'Pod "p" is invalid: spec: Forbidden: pod updates may not change fields'
    )
    status, _ = await _error(
        core.patch_namespaced_pod(
            "p",
            "default",
            {"spec": {"containers": [{"name": "main", "resources": {"limits": {"cpu": "1"}}}]}},
        )
    )
    assert status == 422


async def test_create_defaults(fake_api_aio_client: Any) -> None:
    core = client.CoreV1Api(fake_api_aio_client)
    body = pod("p")
    body["spec"]["containers"][0].update(image="busybox", resources={"limits": {"cpu": "1", "memory": "1Gi"}})
    created = await core.create_namespaced_pod("default", body)
    container = created.spec.containers[0]
    assert container.image_pull_policy == "Always"  # untagged image
    assert container.resources.requests == {"cpu": "1", "memory": "1Gi"}  # requests default to limits
    assert created.status.qos_class == "Guaranteed"
    assert created.spec.scheduler_name == "default-scheduler"
    assert created.spec.termination_grace_period_seconds == 30
    assert [t.key for t in created.spec.tolerations] == [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    ]


def test_qos_classes() -> None:
    def spec(*resources: dict[str, Any]) -> dict[str, Any]:
        return {"containers": [{"name": f"c{i}", "resources": r} for i, r in enumerate(resources)]}

    both = {"cpu": "1", "memory": "1Gi"}
    assert qos_class(spec({})) == "BestEffort"
    assert qos_class(spec({"requests": {"nvidia.com/gpu": "1"}})) == "BestEffort"  # only cpu/memory count
    assert qos_class(spec({"requests": both, "limits": both})) == "Guaranteed"
    assert qos_class(spec({"requests": {"cpu": "1000m", "memory": "1Gi"}, "limits": both})) == "Guaranteed"
    assert qos_class(spec({"requests": both, "limits": both}, {"requests": {"cpu": "1"}})) == "Burstable"
    assert qos_class(spec({"requests": {"cpu": "500m"}, "limits": both})) == "Burstable"


async def test_names_are_validated_and_generated(fake_api_aio_client: Any) -> None:
    core = client.CoreV1Api(fake_api_aio_client)
    status, body = await _error(core.create_namespaced_pod("default", pod("Not_Valid")))
    assert status == 422
    assert body["details"]["causes"][0]["field"] == "metadata.name"
    generated = await core.create_namespaced_pod(
        "default", {**pod(""), "metadata": {"generateName": "worker-", "namespace": "default"}}
    )
    assert (
        generated.metadata.name.startswith("worker-") and len(generated.metadata.name) == len("worker-") + 5
    )
    status, body = await _error(
        core.create_namespaced_pod("default", {**pod("x"), "spec": {"containers": []}})
    )
    assert (status, body["details"]["causes"][0]["field"]) == (422, "spec.containers")


async def test_create_in_a_missing_namespace_is_404(fake_api_aio_client: Any) -> None:
    status, body = await _error(
        client.CoreV1Api(fake_api_aio_client).create_namespaced_pod("nowhere", pod("p", "nowhere"))
    )
    assert (status, body["message"]) == (404, 'namespaces "nowhere" not found')


async def test_create_with_a_resource_version_is_refused(fake_api_aio_client: Any) -> None:
    body = pod("p")
    body["metadata"]["resourceVersion"] = "12"
    status, answer = await _error(
        client.CoreV1Api(fake_api_aio_client).create_namespaced_pod("default", body)
    )
    assert (status, answer["message"]) == (500, "resourceVersion should not be set on objects to be created")


async def _bind(api: Any, name: str, node: str = "n1", **meta: Any) -> tuple[int, dict[str, Any]]:
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, **meta},
        "target": {"name": node},
    }
    response = await client.CoreV1Api(api).create_namespaced_pod_binding_without_preload_content(
        name, "default", binding
    )
    return response.status, json.loads(await response.read())


async def test_binding_refusals(fake_api: FakeApiServer, fake_api_aio_client: Any) -> None:
    fake_api.put(pod("gated", gates=["x/wait"]))
    status, body = await _bind(fake_api_aio_client, "gated")
    assert (status, body["message"]) == (
        409,
        'Operation cannot be fulfilled on pods/binding "gated": '
        "pod gated has non-empty .spec.schedulingGates",
    )
    fake_api.put(pod("mine"))
    status, body = await _bind(fake_api_aio_client, "mine", uid="00000000-0000-0000-0000-000000000000")
    assert status == 409
    assert "Precondition failed: UID in precondition: 00000000-0000-0000-0000-000000000000" in body["message"]
    uid = fake_api.get("pods", "mine", "default")["metadata"]["uid"]  # type: ignore[index]
    status, _ = await _bind(
        fake_api_aio_client, "mine", uid=uid, annotations={"example.com/bound-by": "test"}
    )
    assert status == 201
    stored = fake_api.get("pods", "mine", "default")
    assert stored is not None and stored["metadata"]["annotations"] == {"example.com/bound-by": "test"}


async def test_a_gated_pods_scheduling_directives_may_only_be_narrowed(fake_api_aio_client: Any) -> None:
    """KEP-3838, as the real releases answer (bench/pinning.py): while gated, node affinity may be
    set where there was none, or a term's fields added to; nodeSelector entries added; widening is
    refused, and nothing changes once the gate is gone."""
    core = client.CoreV1Api(fake_api_aio_client)
    await core.create_namespaced_pod("default", pod("g", gates=["example.com/wait"]))
    field_ = {"key": "metadata.name", "operator": "In", "values": ["n1"]}
    pinned = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [field_]}]
            }
        }
    }
    await core.patch_namespaced_pod(
        "g", "default", {"spec": {"affinity": pinned, "nodeSelector": {"a": "b"}}}
    )
    other = {**field_, "values": ["n2"]}
    narrower = [
        {
            "op": "add",
            "path": "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms/0/matchFields/-",
            "value": other,
        }
    ]
    await core.patch_namespaced_pod("g", "default", narrower, _content_type="application/json-patch+json")
    status, _ = await _error(
        core.patch_namespaced_pod("g", "default", {"spec": {"nodeSelector": {"a": "c"}}})
    )
    assert status == 422  # changing an entry widens
    await core.patch_namespaced_pod(
        "g", "default", {"spec": {"schedulingGates": None}}, _content_type="application/merge-patch+json"
    )
    status, body = await _error(
        core.patch_namespaced_pod("g", "default", {"spec": {"nodeSelector": {"x": "y"}}})
    )
    assert status == 422 and "pod updates may not change fields" in body["message"]
