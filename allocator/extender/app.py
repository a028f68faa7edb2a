"""The two aiohttp applications: the extender (HTTPS, mutual TLS) and health/metrics (plain HTTP)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client.aiohttp import make_aiohttp_handler

from allocator.extender.handlers import bind, common, filter, preempt, prioritize
from allocator.extender.handlers.notices import NOTICES, PodNotices
from allocator.extender.handlers.service_view import ServiceView
from allocator.runtime.tls import ClientAllowlist, client_auth_middleware

log = logging.getLogger(__name__)

VerbHandler = Callable[[web.Request, ServiceView], Awaitable[web.Response]]
VERBS: dict[str, VerbHandler] = {
    "filter": filter.handle,
    "prioritize": prioritize.handle,
    "bind": bind.handle,
    "preempt": preempt.handle,
}
# Results that are not failures of the call (they still count in topoalloc_extender_requests).
SUCCESS = ("ok", "no_devices")
HEALTH_PATHS = ("/healthz", "/readyz", "/syncz", "/metrics")
# kube-scheduler sends the whole NodeList in Nodes mode: ~2.5 KB per node.
MAX_BODY = 128 * 1024 * 1024


def _verb_handler(
    svc: ServiceView, verb: str, handler: VerbHandler
) -> Callable[[web.Request], Awaitable[web.Response]]:
    metrics = svc.metrics
    latency = metrics.latency.labels(verb)

    async def run(request: web.Request) -> web.Response:
        started = time.perf_counter()
        cpu_started = time.thread_time()
        try:
            if not svc.synced:
                response = _not_synced(request, verb)
            else:
                response = await handler(request, svc)
        except Exception:
            log.exception("%s failed", verb)
            request[common.RESULT] = "internal_error"
            response = web.Response(status=500, text="internal error; see the allocator's log\n")
        result = request.get(common.RESULT, "ok")
        elapsed = time.perf_counter() - started
        latency.observe(elapsed)
        # For people measuring latency with curl or a benchmark (kube-scheduler ignores it): the
        # time spent and the CPU time used; a gap between them means the process waited for a CPU.
        cpu = time.thread_time() - cpu_started
        response.headers["Server-Timing"] = f"app;dur={elapsed * 1000:.3f}, cpu;dur={cpu * 1000:.3f}"
        metrics.requests.labels(verb, result).inc()
        if result not in SUCCESS:
            metrics.failures.labels(verb, result).inc()
        return response

    return run


def _not_synced(request: web.Request, verb: str) -> web.Response:
    """Until the watch cache holds every allocation, any answer could double-book a device."""
    message = "allocator cache is not synced yet"
    if verb == "prioritize":
        request[common.RESULT] = "not_synced"
        return web.Response(status=503, text=message + "\n")
    return common.json_reply(request, {"Error": message}, "not_synced")


def extender_app(svc: ServiceView, allowlist: ClientAllowlist) -> web.Application:
    app = web.Application(
        client_max_size=MAX_BODY,
        middlewares=[client_auth_middleware(allowlist, lambda _reason: svc.metrics.client_rejections.inc())],
    )
    app[NOTICES] = PodNotices()
    for verb, handler in VERBS.items():
        # kube-scheduler POSTs to <urlPrefix>/<verb>; any path prefix is accepted.
        app.router.add_post(r"/{prefix:(?:.*/)?}" + verb, _verb_handler(svc, verb, handler), name=verb)
    return app


def health_app(svc: ServiceView) -> web.Application:
    async def healthz(_request: web.Request) -> web.Response:
        problem = svc.health_problem()
        if problem:
            return web.Response(status=500, text=problem + "\n")
        return web.Response(text="ok\n")

    async def readyz(_request: web.Request) -> web.Response:
        reasons = svc.not_ready_reasons()
        svc.metrics.ready.set(0 if reasons else 1)
        if reasons:
            return web.Response(status=503, text="not ready: " + "; ".join(reasons) + "\n")
        return web.Response(text="ok\n")

    async def syncz(_request: web.Request) -> web.Response:
        """Synced, leader or not: the Deployment's readiness (a hot standby is a healthy pod)."""
        if not svc.synced:
            return web.Response(status=503, text="watch cache not synced\n")
        return web.Response(text="ok\n")

    app = web.Application()
    handlers = {
        "/healthz": healthz,
        "/readyz": readyz,
        "/syncz": syncz,
        "/metrics": make_aiohttp_handler(svc.metrics.registry),
    }
    for path in HEALTH_PATHS:
        app.router.add_get(path, handlers[path])
    return app
