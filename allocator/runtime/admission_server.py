"""The allocator's one admission server: every component's webhook route (allocator/runtime/
component.py `routes`) on one HTTPS listener (`admission:` config), with the allocator's certificate
reloaded as it rotates (no client certificate: kube-apiserver presents none) and, on the leader,
the webhook configuration's caBundle kept equal to the CA (allocator/runtime/cabundle.py).

It listens only when some component brings a route."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from aiohttp import web

from allocator.runtime.admission import Count, Reviewer, admission_app
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
        self._runner: web.AppRunner | None = None

    async def start(self, spawn: Spawn) -> int:
        """Listen (the bound port), unless no component brings a route (0)."""
        if not self.routes:
            return 0
        spawn("webhook TLS reload", self.tls.watch(self.reload_interval))
        if self.settings.webhook_configuration:  # "": the caBundle is someone else's (cert-manager)
            spawn("webhook caBundle", self._ca_loop())
        self._runner = web.AppRunner(admission_app(self.routes, count=self.count), access_log=None)
        await self._runner.setup()
        s = self.settings
        site = web.TCPSite(self._runner, s.host, s.port, ssl_context=self.tls.context)
        await site.start()
        self.port = bound_port(site)
        log.info("admission webhook on https://%s:%d (%s)", s.host, self.port, ", ".join(sorted(self.routes)))
        return self.port

    async def _ca_loop(self) -> None:
        while True:
            if self.is_leader():
                await self.ca_bundle.sync()
            await asyncio.sleep(max(self.reload_interval, 1.0))

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


def bound_port(site: web.TCPSite) -> int:
    """The port a site listens on (its settings may say 0)."""
    server = site._server  # aiohttp exposes no public accessor for the bound socket
    sockets = getattr(server, "sockets", None) or []
    return int(sockets[0].getsockname()[1]) if sockets else 0
