"""The allocator's Kubernetes API access: raw JSON over the official `kubernetes.aio` client.

Everything stays a plain dict (parsing a 2,000-pod list into pydantic models costs 7x `json.loads`,
python-stack-notes section 2), so every call goes through the client's `*_without_preload_content`
variants, and the status is checked here: those variants never raise on an HTTP error. That also
avoids the client's Binding bug (it decodes the `Status` reply of pods/binding as a V1Binding and
raises after the bind succeeded). Lease and Event writes go through `raw()`, because the generated
models would re-encode MicroTime fields (`renewTime`, `eventTime`) in a format the API server's
RFC3339Micro parser rejects when the fraction is zero.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
from kubernetes.aio import client as kclient
from kubernetes.aio import config as kconfig

from apis import device, podgroup

log = logging.getLogger(__name__)

JSON = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"


class ApiError(Exception):
    """A non-2xx answer of the API server (or a transport failure, status 0)."""

    def __init__(self, status: int, reason: str = "", message: str = "", body: Any = None) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body
        super().__init__(f"{status} {reason}: {message}" if reason or message else f"HTTP {status}")

    @property
    def gone(self) -> bool:
        return self.status == 410

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @classmethod
    def from_body(cls, status: int, raw: bytes) -> ApiError:
        try:
            body = json.loads(raw)
        except ValueError:
            return cls(status, "", raw[:200].decode(errors="replace"), None)
        if isinstance(body, dict):
            return cls(status, str(body.get("reason", "")), str(body.get("message", "")), body)
        return cls(status, "", str(body)[:200], body)


@dataclass(frozen=True)
class Kind:
    """A resource the watch cache lists and watches across all namespaces."""

    name: str
    group: str  # "" for the core group
    version: str
    plural: str

    @property
    def custom(self) -> bool:
        return bool(self.group)


NODES = Kind("Node", "", "v1", "nodes")
PODS = Kind("Pod", "", "v1", "pods")
DEVICES = Kind(device.KIND, device.GROUP, device.VERSION, device.PLURAL)
PODGROUPS = Kind("PodGroup", podgroup.GROUP, podgroup.VERSION, podgroup.PLURAL)


async def _json(resp: aiohttp.ClientResponse) -> JSON:
    try:
        raw = await resp.read()
    finally:
        resp.release()
    if resp.status >= 300:
        raise ApiError.from_body(resp.status, raw)
    try:
        return json.loads(raw) if raw else {}
    except ValueError as exc:
        raise ApiError(resp.status, "InvalidResponse", f"response is not JSON: {exc}") from None


class KubeApi:
    def __init__(self, api_client: kclient.ApiClient, *, timeout: float = 10.0) -> None:
        self.api_client = api_client
        self.timeout = timeout
        self.core = kclient.CoreV1Api(api_client)
        self.custom = kclient.CustomObjectsApi(api_client)

    @classmethod
    async def connect(
        cls,
        *,
        host: str | None = None,
        kubeconfig: str | None = None,
        context: str | None = None,
        in_cluster: bool = False,
        timeout: float = 10.0,
    ) -> KubeApi:
        """`host` (plain URL, tests), in-cluster service account, or a kubeconfig file."""
        cfg = kclient.Configuration()
        if host:
            # A bare URL (tests, local port-forwards): no credentials, and never via an env proxy.
            cfg = kclient.Configuration(host=host, client_session_kwargs={"trust_env": False})
        elif in_cluster:
            kconfig.load_incluster_config(client_configuration=cfg)
        else:
            await kconfig.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
        cfg.connection_pool_maxsize = 64
        return cls(kclient.ApiClient(cfg), timeout=timeout)

    async def close(self) -> None:
        await self.api_client.close()

    # -- generic raw request (bodies passed through untouched) ----------------------------------

    async def raw(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: dict[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> JSON:
        ac = self.api_client
        headers = {"Accept": "application/json", "Content-Type": content_type}
        query_list = [(k, v) for k, v in (query or {}).items() if v is not None]
        m, url, hdrs, data, post = await ac.param_serialize(
            method,
            path,
            header_params=headers,
            query_params=query_list,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            resp = await ac.call_api(m, url, hdrs, data, post, _request_timeout=self.timeout)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ApiError(0, "Transport", str(exc) or type(exc).__name__) from exc
        return await _json(resp.response)

    async def _call(self, coro: Any) -> JSON:
        try:
            resp = await coro
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ApiError(0, "Transport", str(exc) or type(exc).__name__) from exc
        return await _json(resp)

    # -- list / watch -----------------------------------------------------------------------------

    def _list_call(self, kind: Kind, **params: Any) -> Any:
        if kind.custom:
            return self.custom.list_cluster_custom_object_without_preload_content(
                kind.group, kind.version, kind.plural, **params
            )
        if kind is NODES or kind.plural == "nodes":
            return self.core.list_node_without_preload_content(**params)
        if kind.plural == "pods":
            return self.core.list_pod_for_all_namespaces_without_preload_content(**params)
        raise ValueError(f"no list call for {kind}")

    async def list(self, kind: Kind, *, page_size: int = 500) -> tuple[list[JSON], str]:
        """A consistent LIST (read from etcd, pages of `page_size`): the items and the list's
        resourceVersion to watch from."""
        items: list[JSON] = []
        token: str | None = None
        rv = ""
        while True:
            page = await self._call(
                self._list_call(kind, limit=page_size, _continue=token, _request_timeout=self.timeout * 6)
            )
            meta = page.get("metadata") or {}
            if not rv:
                rv = str(meta.get("resourceVersion") or "")
            items.extend(page.get("items") or [])
            token = meta.get("continue") or None
            if not token:
                return items, rv

    async def watch(
        self, kind: Kind, resource_version: str, *, timeout_seconds: int = 300
    ) -> AsyncIterator[JSON]:
        """Watch events (`{"type", "object"}` dicts) from `resource_version`, with bookmarks.

        Raises ApiError for a non-200 answer. An `ERROR` event (e.g. the 410 of a compacted
        resourceVersion) is yielded like any other event; the caller decides."""
        try:
            resp = await self._list_call(
                kind,
                watch=True,
                resource_version=resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=timeout_seconds,
                _request_timeout=float(timeout_seconds + 30),
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ApiError(0, "Transport", str(exc) or type(exc).__name__) from exc
        try:
            if resp.status != 200:
                raise ApiError.from_body(resp.status, await resp.read())
            async for event in self._events(resp):
                yield event
        finally:
            resp.release()

    @staticmethod
    async def _events(resp: aiohttp.ClientResponse) -> AsyncIterator[JSON]:
        try:
            buffer = bytearray()
            # Split lines ourselves: a Device CR or a big pod can exceed aiohttp's readline limit.
            async for chunk in resp.content.iter_any():
                start = len(buffer)
                buffer += chunk
                nl = buffer.find(b"\n", start)
                if nl < 0:
                    continue
                lines = bytes(buffer).split(b"\n")
                buffer = bytearray(lines.pop())
                for line in lines:
                    if line.strip():
                        yield json.loads(line)
            if buffer.strip():
                yield json.loads(bytes(buffer))
        except (aiohttp.ClientError, TimeoutError) as exc:
            # The stream broke (connection dropped, payload cut short): the caller resumes.
            raise ApiError(0, "Transport", str(exc) or type(exc).__name__) from exc

    # -- pods -------------------------------------------------------------------------------------

    async def get_pod(self, namespace: str, name: str) -> JSON:
        return await self._call(
            self.core.read_namespaced_pod_without_preload_content(
                name, namespace, _request_timeout=self.timeout
            )
        )

    async def patch_pod(self, namespace: str, name: str, patch: JSON) -> JSON:
        """RFC 7386 merge patch (a `null` value deletes the key)."""
        return await self._call(
            self.core.patch_namespaced_pod_without_preload_content(
                name, namespace, patch, _content_type=MERGE_PATCH, _request_timeout=self.timeout
            )
        )

    async def bind_pod(self, namespace: str, name: str, uid: str, node: str) -> None:
        """POST pods/binding. The API server answers 201 with a Status; 409 if already bound or the
        uid no longer matches (wire apiserver README)."""
        meta: JSON = {"name": name, "namespace": namespace}
        if uid:
            meta["uid"] = uid  # a precondition: never bind a re-created pod of the same name
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await self._call(
            self.core.create_namespaced_pod_binding_without_preload_content(
                name, namespace, body, _request_timeout=self.timeout
            )
        )

    # -- events and leases (raw: MicroTime fields) ------------------------------------------------

    async def create_event(self, namespace: str, event: JSON) -> JSON:
        return await self.raw("POST", f"/apis/events.k8s.io/v1/namespaces/{namespace}/events", body=event)

    async def patch_event(self, namespace: str, name: str, patch: JSON) -> JSON:
        return await self.raw(
            "PATCH",
            f"/apis/events.k8s.io/v1/namespaces/{namespace}/events/{name}",
            body=patch,
            content_type=MERGE_PATCH,
        )

    def _lease_path(self, namespace: str, name: str | None = None) -> str:
        base = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        return f"{base}/{name}" if name else base

    async def get_lease(self, namespace: str, name: str) -> JSON | None:
        try:
            return await self.raw("GET", self._lease_path(namespace, name))
        except ApiError as exc:
            if exc.not_found:
                return None
            raise

    async def create_lease(self, namespace: str, lease: JSON) -> JSON:
        return await self.raw("POST", self._lease_path(namespace), body=lease)

    async def replace_lease(self, namespace: str, name: str, lease: JSON) -> JSON:
        """PUT with `metadata.resourceVersion` set: 409 if someone else wrote it first."""
        return await self.raw("PUT", self._lease_path(namespace, name), body=lease)
