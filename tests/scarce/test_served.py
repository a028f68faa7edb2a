"""The allocator process serves the route on its webhook port over TLS, with gang scheduling and
DRA on (beside their routes) or both off (then on its own)."""

from __future__ import annotations

import base64
import json
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from allocator.runtime.dra_settings import DraSettings
from allocator.runtime.gang_settings import GangSettings
from allocator.scarce.webhook import PATH, PREFERRED
from tests.support.allocator_harness import running_allocator
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Pki


def review(pod: dict[str, Any]) -> bytes:
    request = {"uid": "u-1", "kind": {"kind": "Pod"}, "operation": "CREATE", "object": pod}
    return json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    ).encode()


CPU_POD = {
    "metadata": {"name": "web"},
    "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
}


@pytest.mark.parametrize("others", [True, False], ids=["beside-gang-and-dra", "alone"])
async def test_the_route_answers_over_tls(fake_api: FakeApiServer, tmp_path: Path, others: bool) -> None:
    pki = Pki(tmp_path / "pki")
    overrides: dict[str, Any] = {}
    if not others:
        overrides = {
            "gang": GangSettings(enabled=False),
            "dra": DraSettings(enabled=False),
        }
    async with running_allocator(fake_api, pki, **overrides) as run:
        assert run.service.webhook_port
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(pki.dir / "ca.crt"))
        url = f"https://127.0.0.1:{run.service.webhook_port}{PATH}"
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session:
            async with session.post(url, data=review(CPU_POD)) as resp:
                assert resp.status == 200
                answer = await resp.json()
            async with session.post(url, data=b"{nope") as resp:
                assert resp.status == 400
    ops = json.loads(base64.b64decode(answer["response"]["patch"]))
    assert ops[0]["path"] == "/spec/affinity"
    assert ops[0]["value"]["nodeAffinity"][PREFERRED][0]["weight"] == 50
