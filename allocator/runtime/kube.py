"""The allocator's Kubernetes API access: raw JSON over aiohttp, configured by `kubernetes.aio`.

Everything stays a plain dict (parsing a 2,000-pod list into pydantic models costs 7x `json.loads`,
python-stack-notes section 2) and the status is checked here. No generated client models: they
decode the `Status` reply of pods/binding as a V1Binding and raise after the bind succeeded, and
re-encode MicroTime fields (`renewTime`, `eventTime`) in a format the API server's RFC3339Micro
parser rejects when the fraction is zero. No generated API classes either (see `KubeApi`).
"""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import aiohttp.helpers
import orjson
from kubernetes.aio import client as kclient
from kubernetes.aio import config as kconfig
from yarl import URL

from apis import device, dra, podgroup, reservation, workload

log = logging.getLogger(__name__)

JSON = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"
# Built-in kinds only: merges lists by their patchMergeKey (a native PodGroup's conditions by type).
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
USER_AGENT = "topoalloc-allocator"


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

    name: str  # unique among the kinds watched (metric label, log name)
    group: str  # "" for the core group
    version: str
    plural: str
    # A kind that may not be there for us: looked up through API discovery before every LIST (an
    # alpha API the server serves only when turned on), and a LIST that RBAC forbids is an empty set
    # too, not an outage (an allocator upgraded before its ClusterRole still serves; it just weighs
    # no budgets).
    optional: bool = False

    @property
    def custom(self) -> bool:
        return bool(self.group)

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


NODES = Kind("Node", "", "v1", "nodes")
PODS = Kind("Pod", "", "v1", "pods")
DEVICES = Kind(device.KIND, device.GROUP, device.VERSION, device.PLURAL)
PODGROUPS = Kind("PodGroup", podgroup.GROUP, podgroup.VERSION, podgroup.PLURAL)
# Kubernetes' own gang API: 1.36 serves v1alpha2 PodGroups, 1.35 v1alpha1 Workloads (apis/workload.py).
NATIVE_PODGROUPS = Kind(
    "PodGroup.scheduling.k8s.io", workload.GROUP, workload.V1ALPHA2, workload.PODGROUPS, optional=True
)
WORKLOADS = Kind("Workload", workload.GROUP, workload.V1ALPHA1, workload.WORKLOADS, optional=True)
RESERVATIONS = Kind(reservation.KIND, reservation.GROUP, reservation.VERSION, reservation.PLURAL)
# DRA (resource.k8s.io/v1): what claims are allocated from and against.
RESOURCECLAIMS = Kind("ResourceClaim", dra.GROUP, dra.VERSION, "resourceclaims")
RESOURCECLAIMTEMPLATES = Kind("ResourceClaimTemplate", dra.GROUP, dra.VERSION, "resourceclaimtemplates")
DEVICECLASSES = Kind("DeviceClass", dra.GROUP, dra.VERSION, "deviceclasses")
RESOURCESLICES = Kind("ResourceSlice", dra.GROUP, dra.VERSION, "resourceslices")
DRA_KINDS = (DEVICECLASSES, RESOURCESLICES, RESOURCECLAIMTEMPLATES, RESOURCECLAIMS)
PDBS = Kind("PodDisruptionBudget", "policy", "v1", "poddisruptionbudgets", optional=True)


async def _body(resp: aiohttp.ClientResponse) -> bytes:
    """The reply's body; ApiError for a status that is not a success."""
    try:
        raw = await resp.read()
    finally:
        resp.release()
    if resp.status >= 300:
        raise ApiError.from_body(resp.status, raw)
    return raw


class ListPages:
    """The items of a LIST as the JSON text of its pages: iterating decodes one page at a time
    (every iteration decodes again), `len` is the number of items."""

    def __init__(self, pages: list[bytes], count: int) -> None:
        self.pages = pages
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[JSON]:
        for raw in self.pages:
            yield from _loads(raw).get("items") or []


async def _json(resp: aiohttp.ClientResponse, decode: bool = True) -> JSON:
    raw = await _body(resp)
    if not decode:
        return {}
    try:
        return _loads(raw) if raw else {}
    except ValueError as exc:
        raise ApiError(resp.status, "InvalidResponse", f"response is not JSON: {exc}") from None


def _loads(raw: bytes) -> Any:
    """`json.loads`, with orjson (3-4x faster on pods and Device CRs); what orjson refuses
    (NaN, lone surrogates) goes to `json`, so exactly the same documents decode."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _env_proxy(host: str, cfg: kclient.Configuration) -> str | None:
    """The proxy HTTPS_PROXY/HTTP_PROXY (minus NO_PROXY) names for the API server, as the
    client library's `trust_env` session would find it on every request. None for a bare URL."""
    if (getattr(cfg, "client_session_kwargs", None) or {}).get("trust_env") is False:
        return None
    try:
        proxy, _auth = aiohttp.helpers.get_env_proxy_for_url(URL(host))
    except LookupError:
        return None
    return str(proxy)


class KubeApi:
    """The API calls the allocator makes, straight over one aiohttp session.

    The configuration (kubeconfig, in-cluster service account, bearer-token refresh, TLS) comes
    from `kubernetes.aio`; the requests do not go through its generated API classes. Those cost
    about 0.4 ms of CPU per call (pydantic argument validation, parameter sanitising, a fresh
    proxy and netrc lookup in a thread for every request), paid twice per bind and once per
    watch connection; here a call is the request and `orjson` on the reply. The proxy the
    environment names for the API server is looked up once, at connect.
    """

    def __init__(self, configuration: kclient.Configuration, *, timeout: float = 10.0) -> None:
        self.configuration = configuration
        self.timeout = timeout
        self.host = configuration.host.rstrip("/")
        self._session: aiohttp.ClientSession | None = None
        self._proxy = configuration.proxy or _env_proxy(self.host, configuration)

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
        return cls(cfg, timeout=timeout)

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            cfg = self.configuration
            ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert, cadata=cfg.ca_cert_data)
            if cfg.cert_file:
                ctx.load_cert_chain(cfg.cert_file, keyfile=cfg.key_file)
            if cfg.disable_strict_ssl_verification:
                ctx.verify_flags &= ~ssl.VERIFY_X509_STRICT
            if not cfg.verify_ssl:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            connector = aiohttp.TCPConnector(limit=cfg.connection_pool_maxsize, ssl=ctx)
            # Kubernetes watch events can exceed aiohttp's default read buffer.
            self._session = aiohttp.ClientSession(connector=connector, trust_env=False, read_bufsize=2**21)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _send(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: dict[str, Any] | None = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> aiohttp.ClientResponse:
        cfg = self.configuration
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else orjson.dumps(body)
            headers["Content-Type"] = content_type
        token = await cfg.get_api_key_with_prefix("BearerToken", alias="authorization")
        if token:
            headers["Authorization"] = token
        params = {k: _query_value(v) for k, v in (query or {}).items() if v is not None}
        extra: dict[str, Any] = {}
        if cfg.tls_server_name:
            extra["server_hostname"] = cfg.tls_server_name
        try:
            return await self.session().request(
                method,
                self.host + path,
                params=params,
                data=data,
                headers=headers,
                proxy=self._proxy,
                timeout=aiohttp.ClientTimeout(total=timeout or self.timeout),
                **extra,
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ApiError(0, "Transport", str(exc) or type(exc).__name__) from exc

    async def _call(self, method: str, path: str, *, decode: bool = True, **kwargs: Any) -> JSON:
        resp = await self._send(method, path, **kwargs)
        try:
            return await _json(resp, decode)
        except (aiohttp.ClientError, TimeoutError) as exc:  # the body broke off
            raise ApiError(0, "Transport", str(exc) or type(exc).__name__) from exc

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
        return await self._call(method, path, body=body, query=query, content_type=content_type)

    # -- list / watch -----------------------------------------------------------------------------

    @staticmethod
    def _collection(kind: Kind) -> str:
        """The cluster-wide collection path of `kind`."""
        if kind.custom:
            return f"/apis/{kind.group}/{kind.version}/{kind.plural}"
        return f"/api/{kind.version}/{kind.plural}"

    async def serves(self, kind: Kind) -> bool:
        """API discovery: whether the server serves `kind` in its group and version now."""
        path = f"/apis/{kind.group_version}" if kind.group else f"/api/{kind.version}"
        try:
            found = await self._call("GET", path)
        except ApiError as exc:
            if exc.not_found:
                return False
            raise
        return any(isinstance(r, dict) and r.get("name") == kind.plural for r in found.get("resources") or [])

    async def list(self, kind: Kind, *, page_size: int = 500) -> tuple[list[JSON], str]:
        """A consistent LIST (read from etcd, pages of `page_size`): the items and the list's
        resourceVersion to watch from."""
        pages, rv = await self.list_pages(kind, page_size=page_size)
        return list(pages), rv

    async def list_pages(self, kind: Kind, *, page_size: int = 500) -> tuple[ListPages, str]:
        """`list`, with the items kept as the pages' JSON text and decoded again, a page at a time,
        whenever they are iterated: a LIST of 10,000 Device CRs is ~0.5 GB as dicts, ~0.15 GB
        as text, and dicts decoded all at once leave their memory fragmented for good."""
        pages: list[bytes] = []
        count = 0
        token: str | None = None
        rv = ""
        while True:
            resp = await self._send(
                "GET",
                self._collection(kind),
                query={"limit": page_size, "continue": token},
                timeout=self.timeout * 6,
            )
            try:
                raw = await _body(resp)
                page = _loads(raw)
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise ApiError(0, "Transport", str(exc) or type(exc).__name__) from exc
            except ValueError as exc:
                raise ApiError(resp.status, "InvalidResponse", f"response is not JSON: {exc}") from None
            meta = page.get("metadata") or {}
            if not rv:
                rv = str(meta.get("resourceVersion") or "")
            count += len(page.get("items") or [])
            pages.append(raw)
            token = meta.get("continue") or None
            if not token:
                return ListPages(pages, count), rv

    async def watch(
        self, kind: Kind, resource_version: str, *, timeout_seconds: int = 300
    ) -> AsyncIterator[JSON]:
        """Watch events (`{"type", "object"}` dicts) from `resource_version`, with bookmarks.

        Raises ApiError for a non-200 answer. An `ERROR` event (e.g. the 410 of a compacted
        resourceVersion) is yielded like any other event; the caller decides."""
        query = {
            "watch": True,
            "resourceVersion": resource_version or None,
            "allowWatchBookmarks": True,
            "timeoutSeconds": timeout_seconds,
        }
        resp = await self._send(
            "GET", self._collection(kind), query=query, timeout=float(timeout_seconds + 30)
        )
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
                        yield _loads(line)
            if buffer.strip():
                yield _loads(bytes(buffer))
        except (aiohttp.ClientError, TimeoutError) as exc:
            # The stream broke (connection dropped, payload cut short): the caller resumes.
            raise ApiError(0, "Transport", str(exc) or type(exc).__name__) from exc

    # -- pods -------------------------------------------------------------------------------------

    @staticmethod
    def _pod_path(namespace: str, name: str) -> str:
        return f"/api/v1/namespaces/{namespace}/pods/{name}"

    async def get_pod(self, namespace: str, name: str) -> JSON:
        return await self._call("GET", self._pod_path(namespace, name))

    async def patch_pod(self, namespace: str, name: str, patch: JSON) -> JSON:
        """RFC 7386 merge patch (a `null` value deletes the key)."""
        return await self._call(
            "PATCH", self._pod_path(namespace, name), body=patch, content_type=MERGE_PATCH
        )

    async def bind_pod(
        self, namespace: str, name: str, uid: str, node: str, *, annotations: dict[str, str] | None = None
    ) -> None:
        """POST pods/binding. The API server answers 201 with a Status; 409 if already bound or the
        uid no longer matches (wire apiserver README). `annotations` are set on the pod in the
        same write that binds it (kube-apiserver's binding storage copies them)."""
        meta: JSON = {"name": name, "namespace": namespace}
        if uid:
            meta["uid"] = uid  # a precondition: never bind a re-created pod of the same name
        if annotations:
            meta["annotations"] = annotations
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await self._call("POST", self._pod_path(namespace, name) + "/binding", body=body, decode=False)

    # -- events and leases ------------------------------------------------------------------------

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
