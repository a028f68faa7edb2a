"""The admission server answers on a thread of its own: a route marked `on_any_thread` is answered
while the allocator's main loop is busy (kube-apiserver holds the pod's creation meanwhile); an
unmarked route runs on the main loop's thread, after what held it. Real HTTPS on 127.0.0.1 with
certificates made in the test."""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from allocator.claims import webhook as dra_webhook
from allocator.placement import webhook as placement_webhook
from allocator.runtime import certs as pki
from allocator.runtime.admission import answers_on_any_thread, on_any_thread, patched
from allocator.runtime.admission_server import AdmissionServer
from allocator.runtime.admission_settings import AdmissionSettings
from allocator.runtime.placement_settings import PlacementSettings
from allocator.runtime.scarce_settings import ScarceAvoidanceSettings
from allocator.runtime.tls import TLSFiles
from allocator.scarce import webhook as scarce_webhook
from tests.runtime.test_admission_warnings import gpu_pod, review

HOLD = 1.0  # seconds the main loop is kept busy


def _files(tmp_path: Path) -> TLSFiles:
    ca = pki.make_ca()
    ca.write(tmp_path / "ca.crt", tmp_path / "ca.key")
    server = pki.server_cert(ca, "topoalloc-allocator", "topoalloc-system", ip_addresses=["127.0.0.1"])
    server.write(tmp_path / "tls.crt", tmp_path / "tls.key")
    return TLSFiles(tmp_path / "tls.crt", tmp_path / "tls.key", tmp_path / "ca.crt")


def _post(url: str, ca: Path, out: dict[str, Any]) -> None:
    """POST a review from a thread of the test's own (the main loop will be blocked)."""
    started = time.monotonic()
    body = json.dumps(review(gpu_pod({}))).encode()
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, context=ssl.create_default_context(cafile=str(ca)), timeout=10) as resp:
        out["answer"] = json.loads(resp.read())["response"]
    out["seconds"] = time.monotonic() - started


class _Api:
    """The caBundle injector's API: never called here (no webhook configuration is kept)."""


async def _answer_while_blocked(
    tmp_path: Path, reviewer: Callable[[dict[str, Any]], dict[str, Any]]
) -> dict[str, Any]:
    files = _files(tmp_path)
    settings = AdmissionSettings(host="127.0.0.1", port=0, webhook_configuration="")
    server = AdmissionServer(
        settings,
        {"/review": reviewer},
        api=_Api(),  # type: ignore[arg-type]
        tls_files=files,
        is_leader=lambda: True,
        reload_interval=60.0,
    )
    tasks: list[asyncio.Task[None]] = []
    port = await server.start(lambda name, coro: tasks.append(asyncio.ensure_future(coro)))
    out: dict[str, Any] = {}
    client = threading.Thread(target=_post, args=(f"https://127.0.0.1:{port}/review", files.client_ca, out))
    try:
        client.start()
        time.sleep(HOLD)  # the main loop busy: a claims pass, a burst of watch events
        await asyncio.to_thread(client.join, 10)
    finally:
        await server.stop()
        for task in tasks:
            task.cancel()
    return out


async def test_a_marked_route_is_answered_while_the_main_loop_is_busy(tmp_path: Path) -> None:
    threads: list[int] = []

    def reviewer(request: dict[str, Any]) -> dict[str, Any]:
        threads.append(threading.get_ident())
        return patched(request["uid"], [{"op": "add", "path": "/metadata/labels", "value": {"a": "b"}}])

    out = await _answer_while_blocked(tmp_path, on_any_thread(reviewer))
    assert out["answer"]["allowed"] and out["answer"]["patchType"] == "JSONPatch"
    assert out["seconds"] < HOLD / 2, f"answered after {out['seconds']:.2f} s: it waited for the main loop"
    assert threads and threads[0] != threading.get_ident()  # on the admission thread


async def test_an_unmarked_route_runs_on_the_main_loop_after_what_held_it(tmp_path: Path) -> None:
    threads: list[int] = []

    def reviewer(request: dict[str, Any]) -> dict[str, Any]:
        threads.append(threading.get_ident())
        return patched(request["uid"], None)

    out = await _answer_while_blocked(tmp_path, reviewer)
    assert out["answer"] == {"uid": out["answer"]["uid"], "allowed": True}
    assert out["seconds"] >= HOLD / 2, "answered while the main loop, which owns its state, was busy"
    assert threads == [threading.get_ident()]  # the main loop's thread: the test's own


async def test_a_stopped_admission_thread_is_a_health_problem(tmp_path: Path) -> None:
    settings = AdmissionSettings(host="127.0.0.1", port=0, webhook_configuration="")
    server = AdmissionServer(
        settings,
        {"/review": on_any_thread(lambda r: patched(r["uid"], None))},
        api=_Api(),  # type: ignore[arg-type]
        tls_files=_files(tmp_path),
        is_leader=lambda: True,
        reload_interval=60.0,
    )
    tasks: list[asyncio.Task[None]] = []
    await server.start(lambda name, coro: tasks.append(asyncio.ensure_future(coro)))
    try:
        assert server.problem() == ""
        thread, loop = server._thread, server._loop
        assert thread is not None and loop is not None
        loop.call_soon_threadsafe(loop.stop)  # as if its loop had ended on its own
        await asyncio.to_thread(thread.join, 10)
        assert server.problem() == "the admission webhook's thread stopped"
    finally:
        await server.stop()
        for task in tasks:
            task.cancel()


def test_only_the_routes_that_read_answer_off_the_main_loop() -> None:
    """The DRA gate and claim mark and scarce avoidance read their settings and the cache's
    single-key lookups; placement at admission places pods (the core's state): main loop only."""
    view = SimpleNamespace(claims={}, templates={}, classes={}, published={})
    assert answers_on_any_thread(dra_webhook.reviewer(view, lambda: True))
    assert answers_on_any_thread(dra_webhook.claim_reviewer(view, lambda: True))
    assert answers_on_any_thread(scarce_webhook.reviewer(ScarceAvoidanceSettings()))
    places = placement_webhook.reviewer(PlacementSettings(), "topoalloc-system", lambda *args: None)
    assert not answers_on_any_thread(places)
