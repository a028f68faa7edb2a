"""Keep the admission webhook's caBundle equal to the CA the allocator's certificate chains to.

kube-apiserver verifies the webhook's certificate against `clientConfig.caBundle`. The allocator's
TLS Secret carries that CA as ca.crt (from `topoalloc certs` or cert-manager), so the leader writes
it into every webhook of the MutatingWebhookConfiguration that calls our Service, and again after
a rotation: no manual `kubectl patch` step, and no window where a renewed CA breaks admission.
"""

from __future__ import annotations

import base64
import logging
from pathlib import Path
from typing import Any

from allocator.runtime.kube import JSON_PATCH, ApiError, KubeApi, Refused
from apis.kinds import MUTATING_WEBHOOKS

log = logging.getLogger(__name__)

JSON = dict[str, Any]


class CaBundleInjector:
    def __init__(self, api: KubeApi, configuration: str, services: tuple[str, ...], ca_file: Path) -> None:
        """`services`: the webhooks calling one of these Services get the CA."""
        self.api = api
        self.configuration = configuration
        self.services = services
        self.ca_file = ca_file
        self._complained = ""

    async def sync(self) -> int:
        """Patch the webhooks whose caBundle differs; the number patched (0 when in step, missing
        or not permitted: logged once per distinct problem)."""
        try:
            bundle = base64.b64encode(self.ca_file.read_bytes()).decode()
        except OSError as exc:
            self._complain(f"reading the CA for the webhook's caBundle: {exc}")
            return 0
        path = MUTATING_WEBHOOKS.path(self.configuration)
        what = f"keeping the caBundle of MutatingWebhookConfiguration {self.configuration}"
        try:
            config = await self.api.raw("GET", path)
        except ApiError as exc:
            self._complain(f"{what}: {exc}")
            return 0
        ops = self._ops(config, bundle)
        if ops:
            # Said here, once per distinct problem: the leader retries every sync.
            got = await self.api.patch(path, ops, content_type=JSON_PATCH, what=None)
            if isinstance(got, Refused):
                self._complain(f"{what}: {got}")
                return 0
            log.info("caBundle of %d webhook(s) in %s updated", len(ops) // 2, self.configuration)
        self._complained = ""
        return len(ops) // 2

    def _ops(self, config: JSON, bundle: str) -> list[JSON]:
        ops: list[JSON] = []
        for i, hook in enumerate(config.get("webhooks") or []):
            client = hook.get("clientConfig") or {}
            if (client.get("service") or {}).get("name") not in self.services or client.get(
                "caBundle"
            ) == bundle:
                continue
            # The test guards against the list having changed since we read it.
            ops.append({"op": "test", "path": f"/webhooks/{i}/name", "value": hook.get("name")})
            ops.append({"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": bundle})
        return ops

    def _complain(self, message: str) -> None:
        if message != self._complained:
            log.warning("%s", message)
            self._complained = message
