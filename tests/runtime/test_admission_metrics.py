"""Every admission review is counted by route and result on the allocator's registry, failures
included (a body that is not an AdmissionReview, a route that raised: the API server then applies
the webhook's failurePolicy), and every route's series exist from the start. Real HTTP on
127.0.0.1."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from allocator.runtime.admission import admission_app, denied, patched
from allocator.runtime.metrics import Metrics
from tests.runtime.test_admission_warnings import gpu_pod, review


def _boom(_request: dict[str, Any]) -> dict[str, Any]:
    raise RuntimeError("a bug in a route")


async def test_reviews_are_counted_by_route_and_result() -> None:
    metrics = Metrics()
    routes = {
        "/gate": lambda r: patched(r["uid"], [{"op": "add", "path": "/spec/schedulingGates", "value": []}]),
        "/pass": lambda r: patched(r["uid"], None),
        "/deny": lambda r: denied(r["uid"], "no"),
        "/boom": _boom,
    }
    metrics.expect_reviews(routes)

    def value(route: str, result: str) -> float | None:
        return metrics.registry.get_sample_value(
            "topoalloc_admission_reviews_total", {"route": route, "result": result}
        )

    assert value("/boom", "error") == 0.0 and value("/gate", "patched") == 0.0  # series from the start
    app = admission_app(routes, count=metrics.count_review)
    body = json.dumps(review(gpu_pod({})))
    async with TestServer(app, host="127.0.0.1") as server, aiohttp.ClientSession() as session:
        for path, times in (("/gate", 2), ("/pass", 1), ("/deny", 1), ("/boom", 1)):
            for _ in range(times):
                async with session.post(server.make_url(path), data=body) as resp:
                    assert resp.status == (500 if path == "/boom" else 200)
        async with session.post(server.make_url("/pass"), data=b"{}") as resp:
            assert resp.status == 400
    assert value("/gate", "patched") == 2
    assert value("/pass", "allowed") == 1 and value("/pass", "bad_request") == 1
    assert value("/deny", "denied") == 1
    assert value("/boom", "error") == 1 and value("/boom", "allowed") == 0
