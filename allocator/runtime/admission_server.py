"""The allocator's one admission server: every component's webhook route (allocator/runtime/
component.py `routes`) on one HTTPS listener (`admission:` config), with the allocator's certificate
reloaded as it rotates (no client certificate: kube-apiserver presents none) and, on the leader,
the webhook configuration's caBundle kept equal to the CA (allocator/runtime/cabundle.py).

It serves on a thread of its own, with its own event loop: kube-apiserver holds every pod's creation
until the webhook answers, and on the main loop an answer waited behind whatever was queued there
(watch events, a claims pass, write tasks); under a burst of creations that was most of a review's
time. TLS, HTTP and the routes marked `on_any_thread` (they read only single-key lookups of the
cache) are answered there; every other reviewer is handed to the main loop, which owns the state
it reads and writes, and answered when it has run.

It listens only when some component brings a route."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable, Mapping

from aiohttp import web

from allocator.runtime.admission import (
    JSON,
    Count,
    Reviewer,
    admission_app,
    answer_here,
    answers_on_any_thread,
)
from allocator.runtime.admission_settings import LEADER_SERVICE, WEBHOOK_SERVICE, AdmissionSettings
from allocator.runtime.cabundle import CaBundleInjector
from allocator.runtime.kube import KubeApi
from allocator.runtime.tasks import Spawn
from allocator.runtime.tls import ReloadingTLS, TLSFiles

log = logging.getLogger(__name__)


class AdmissionServer:
    def __init__(
        self,
        settings: AdmissionSettings,
        routes: Mapping[str, Reviewer],
        *,
        api: KubeApi,
        tls_files: TLSFiles,
        is_leader: Callable[[], bool],
        reload_interval: float,
        count: Count | None = None,
    ) -> None:
        self.settings = settings
        self.count = count
        self.routes = dict(routes)
        self.tls = ReloadingTLS(tls_files, client_certs=False)
        self.is_leader = is_leader
        self.reload_interval = reload_interval
        self.ca_bundle = CaBundleInjector(
            api, settings.webhook_configuration, (WEBHOOK_SERVICE, LEADER_SERVICE), tls_files.client_ca
        )
        self.port = 0  # the bound port, once started (the settings may say 0)
        self._main: asyncio.AbstractEventLoop | None = None  # the allocator's loop
        self._loop: asyncio.AbstractEventLoop | None = None  # the admission thread's
        self._thread: threading.Thread | None = None

    async def start(self, spawn: Spawn) -> int:
        """Listen (the bound port), unless no component brings a route (0)."""
        if not self.routes:
            return 0
        spawn("webhook TLS reload", self.tls.watch(self.reload_interval))
        if self.settings.webhook_configuration:  # "": the caBundle is someone else's (cert-manager)
            spawn("webhook caBundle", self._ca_loop())
        self._main = asyncio.get_running_loop()
        listening: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._serve, args=(listening,), name="admission", daemon=True)
        self._thread.start()
        self.port = await asyncio.wrap_future(listening)
        s = self.settings
        log.info("admission webhook on https://%s:%d (%s)", s.host, self.port, ", ".join(sorted(self.routes)))
        return self.port

    def _serve(self, listening: concurrent.futures.Future[int]) -> None:
        """The admission thread: listen, say the port (or why not), serve until stopped."""
        loop = self._loop = asyncio.new_event_loop()
        runner = web.AppRunner(admission_app(self.routes, count=self.count, call=self._call), access_log=None)
        try:
            loop.run_until_complete(runner.setup())
            s = self.settings
            site = web.TCPSite(runner, s.host, s.port, ssl_context=self.tls.context)
            loop.run_until_complete(site.start())
        except BaseException as exc:  # said to start(), which raises it
            loop.run_until_complete(runner.cleanup())
            loop.close()
            listening.set_exception(exc)
            return
        listening.set_result(bound_port(site))
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(runner.cleanup())
            loop.close()

    def problem(self) -> str:
        """Why the server no longer answers ("" while it does, or was never started)."""
        if self._thread is not None and not self._thread.is_alive():
            return "the admission webhook's thread stopped"
        return ""

    async def _call(self, reviewer: Reviewer, review: JSON) -> JSON:
        """Answer on this thread when the reviewer may, else on the main loop."""
        if answers_on_any_thread(reviewer):
            return reviewer(review)
        assert self._main is not None  # start() sets it before the thread serves
        answered = asyncio.run_coroutine_threadsafe(answer_here(reviewer, review), self._main)
        return await asyncio.wrap_future(answered)

    async def _ca_loop(self) -> None:
        while True:
            if self.is_leader():
                await self.ca_bundle.sync()
            await asyncio.sleep(max(self.reload_interval, 1.0))

    async def stop(self) -> None:
        """Stop listening; reviews in flight finish (those on the main loop run meanwhile)."""
        thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            return
        self._thread = None
        with contextlib.suppress(RuntimeError):  # its loop ended already (closed)
            loop.call_soon_threadsafe(loop.stop)
        await asyncio.to_thread(thread.join)


def bound_port(site: web.TCPSite) -> int:
    """The port a site listens on (its settings may say 0)."""
    server = site._server  # aiohttp exposes no public accessor for the bound socket
    sockets = getattr(server, "sockets", None) or []
    return int(sockets[0].getsockname()[1]) if sockets else 0
