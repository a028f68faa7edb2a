"""The admission webhook over real TLS: what it patches, what it leaves alone, what it refuses,
and that no body makes it answer 500."""

from __future__ import annotations

import base64
import json
import ssl
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocator.gang.webhook import PATH, gate_patch, review_response, webhook_app
from allocator.runtime.tls import ReloadingTLS
from apis import keys
from tests.gang.harness import member
from tests.support.pki import Pki

GATE = {"name": keys.GANG_SCHEDULING_GATE}


class Hook:
    def __init__(self, url: str, session: aiohttp.ClientSession) -> None:
        self.url = url
        self.session = session

    async def post(self, body: bytes) -> tuple[int, Any]:
        async with self.session.post(self.url, data=body, headers={"Content-Type": "application/json"}) as r:
            text = await r.text()
            return r.status, (json.loads(text) if r.status == 200 else text)

    async def review(self, pod: Any, operation: str = "CREATE", uid: str = "u-1") -> dict[str, Any]:
        body = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": uid,
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "operation": operation,
                "object": pod,
            },
        }
        status, answer = await self.post(json.dumps(body).encode())
        assert status == 200, answer
        assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
        assert answer["response"]["uid"] == uid
        return answer["response"]


def patch_of(response: dict[str, Any]) -> list[dict[str, Any]] | None:
    if "patch" not in response:
        return None
    assert response["patchType"] == "JSONPatch"
    return json.loads(base64.b64decode(response["patch"]))


@pytest.fixture
async def hook(pki: Pki) -> AsyncIterator[Hook]:
    """The webhook app behind the allocator's certificate, no client certificate asked for."""
    tls = ReloadingTLS(pki.server, client_certs=False)
    runner = web.AppRunner(webhook_app(["default-scheduler", "topoalloc-scheduler"]))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls.context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(pki.dir / "ca.crt"))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session:
        yield Hook(f"https://127.0.0.1:{port}{PATH}", session)
    await runner.cleanup()


async def test_a_member_gets_the_gate(hook: Hook) -> None:
    response = await hook.review(member("w0", group="pg"))
    assert response["allowed"] is True
    assert patch_of(response) == [{"op": "add", "path": "/spec/schedulingGates", "value": [GATE]}]


async def test_the_gate_goes_after_other_gates_and_only_once(hook: Hook) -> None:
    pod = member("w0", annotations={keys.GANG_NAME: "kg", keys.GANG_MIN_AVAILABLE: "2"})
    pod["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    assert patch_of(await hook.review(pod)) == [
        {"op": "add", "path": "/spec/schedulingGates/-", "value": GATE}
    ]
    assert patch_of(await hook.review(member("w1", group="pg", gated=True))) is None


async def test_legacy_label_member_is_gated(hook: Hook) -> None:
    pod = member("w0", labels={keys.POD_GROUP_LABEL_LEGACY: "old"})
    assert patch_of(await hook.review(pod)) is not None


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda p: p["metadata"]["labels"].clear(), id="not-a-member"),
        pytest.param(lambda p: p["spec"].__setitem__("nodeName", "n1"), id="bound-at-creation"),
        pytest.param(lambda p: p["spec"].__setitem__("schedulerName", "volcano"), id="another-scheduler"),
    ],
)
async def test_pods_left_alone(hook: Hook, change: Any) -> None:
    pod = member("w0", group="pg")
    change(pod)
    response = await hook.review(pod)
    assert response == {"uid": "u-1", "allowed": True}


async def test_only_creations_are_mutated(hook: Hook) -> None:
    assert await hook.review(member("w0", group="pg"), operation="UPDATE") == {"uid": "u-1", "allowed": True}


async def test_a_broken_gang_annotation_is_denied_with_the_reason(hook: Hook) -> None:
    pod = member("w0", annotations={keys.GANG_NAME: "kg", keys.GANG_MIN_AVAILABLE: "two"})
    response = await hook.review(pod)
    assert response["allowed"] is False and "patch" not in response
    assert response["status"]["code"] == 400
    assert keys.GANG_MIN_AVAILABLE in response["status"]["message"]
    assert "must be a positive integer" in response["status"]["message"]
    response = await hook.review({"metadata": [], "spec": {}})
    assert response["allowed"] is False and "not a Pod" in response["status"]["message"]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"", "not an AdmissionReview"),
        (b"{nope", "not an AdmissionReview"),
        (b"[]", "expected an AdmissionReview object"),
        (b'{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"x"}}', "v1"),
        (b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}', "request: expected an object"),
        (b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{}}', "request.uid"),
        (
            b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"x","object":[]}}',
            "request.object",
        ),
        (b"\xff\xfe", "not an AdmissionReview"),
    ],
)
async def test_malformed_reviews_get_400_with_the_reason(hook: Hook, body: bytes, says: str) -> None:
    status, text = await hook.post(body)
    assert status == 400 and says in text


JSONS = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(request=JSONS, pod=JSONS)
async def test_no_body_gets_a_500(hook: Hook, request: Any, pod: Any) -> None:
    shapes = [
        request,
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request},
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {"uid": "x", "object": pod},
        },
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {"uid": "x", "object": {"metadata": pod, "spec": pod}},
        },
    ]
    for body in shapes:
        status, _ = await hook.post(json.dumps(body).encode())
        assert status in (200, 400)


@pytest.mark.parametrize(
    "native",
    [{"schedulingGroup": {"podGroupName": "pg1"}}, {"workloadRef": {"name": "train", "podGroup": "workers"}}],
)
def test_a_native_member_is_gated_only_where_its_scheduler_runs_no_gang_plugin(
    native: dict[str, Any],
) -> None:
    pod = member("w0", gpus=1)
    pod["spec"].update(native)
    gated = [{"op": "add", "path": "/spec/schedulingGates", "value": [GATE]}]
    plugin = ["default-scheduler"]
    assert gate_patch(pod, plugin_schedulers=plugin) is None  # kube-scheduler's plugin keeps it whole
    assert gate_patch(pod) == gated  # no scheduler runs the plugin
    pod["spec"]["schedulerName"] = "topoalloc-scheduler"  # a secondary scheduler without the gates
    assert gate_patch(pod, plugin_schedulers=plugin) == gated


def test_a_malformed_native_membership_is_denied_with_the_field() -> None:
    pod = member("w0", gpus=1)
    pod["spec"]["schedulingGroup"] = {"podGroupName": 7}
    answer = review_response({"uid": "u", "object": pod})
    assert not answer["allowed"]
    assert "spec.schedulingGroup.podGroupName: expected a string" in answer["status"]["message"]
