"""Every admission route's answer to a pod creation carries what the pod says that topoalloc ignores
(unknown annotation keys, near-miss resource names) as admission `warnings`, which kubectl prints;
the route's own answer is unchanged and a pod without such mistakes gets none. Real HTTP on
127.0.0.1."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from allocator.runtime.admission import admission_app, denied, patched

TYPO = "scheduling.koordinator.sh/device-joint-alocate"


def review(pod: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
    request = {"uid": "u-1", "kind": {"kind": "Pod"}, "operation": operation, "object": pod}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def gpu_pod(annotations: dict[str, str], resource: str = "nvidia.com/gpu") -> dict[str, Any]:
    requests = {resource: "1"}
    return {
        "metadata": {"name": "p", "annotations": annotations},
        "spec": {"containers": [{"name": "c", "resources": {"requests": requests, "limits": requests}}]},
    }


@pytest.fixture
async def url() -> AsyncIterator[str]:
    app = admission_app(
        {"/allow": lambda r: patched(r["uid"], None), "/deny": lambda r: denied(r["uid"], "no room")}
    )
    async with TestServer(app, host="127.0.0.1") as server:
        yield str(server.make_url(""))


async def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.post(url, data=json.dumps(body)) as resp:
        assert resp.status == 200
        return dict((await resp.json())["response"])


async def test_a_pod_with_mistakes_gets_them_as_warnings_on_every_route(url: str) -> None:
    pod = gpu_pod({TYPO: "{}"}, resource="nvida.com/gpu")
    allowed = await post(url + "/allow", review(pod))
    assert allowed["allowed"] is True and allowed["warnings"] == [
        f"unknown annotation {TYPO} (did you mean scheduling.koordinator.sh/device-joint-allocate?): "
        "topoalloc ignores it",
        "unknown resource nvida.com/gpu (did you mean nvidia.com/gpu?): topoalloc allocates nothing for it",
    ]
    refused = await post(url + "/deny", review(pod))
    assert refused["allowed"] is False and refused["status"]["message"] == "no room"
    assert len(refused["warnings"]) == 2


async def test_a_pod_without_mistakes_and_other_operations_get_none(url: str) -> None:
    ok = gpu_pod({"scheduling.koordinator.sh/device-joint-allocate": "{}"})
    assert "warnings" not in await post(url + "/allow", review(ok))
    assert "warnings" not in await post(url + "/allow", review(gpu_pod({TYPO: "{}"}), "UPDATE"))
