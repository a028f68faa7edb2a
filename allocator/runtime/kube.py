"""The allocator's Kubernetes API access: raw JSON over aiohttp, configured by `kubernetes.aio`.

Everything stays a plain dict (parsing a 2,000-pod list into pydantic models costs 7x `json.loads`,
python-stack-notes section 2) and the status is checked here. No generated client models: they
decode the `Status` reply of pods/binding as a V1Binding and raise after the bind succeeded, and
re-encode MicroTime fields (`renewTime`, `eventTime`) in a format the API server's RFC3339Micro
parser rejects when the fraction is zero. No generated API classes either (see `KubeApi`).
"""

from __future__ import annotations

import email.utils
import logging
import ssl
from collections.abc import AsyncIterator, Collection, Iterator
from typing import Any

import aiohttp
import aiohttp.helpers
import orjson
from kubernetes.aio import client as kclient
from kubernetes.aio import config as kconfig
from yarl import URL

from allocator.runtime.answers import ApiError, Refused, Result, Written
from allocator.runtime.json_codec import loads
from apis.kinds import (
    DEVICECLASSES,
    DEVICES,
    DRA_KINDS,
    LEASES,
    NATIVE_PODGROUPS,
    NODES,
    PDBS,
    PODGROUPS,
    PODS,
    RESERVATIONS,
    RESOURCECLAIMS,
    RESOURCECLAIMTEMPLATES,
    RESOURCESLICES,
    SERVER_VERSION,
    WORKLOADS,
    Kind,
)

# The kinds are the contract's table (apis/kinds.py); the runtime's modules and the components
# name them from here, beside the client that lists and watches them.
__all__ = [
    "DEVICECLASSES",
    "DEVICES",
    "DRA_KINDS",
    "JSON_PATCH",
    "MERGE_PATCH",
    "NATIVE_PODGROUPS",
    "NODES",
    "PDBS",
    "PODGROUPS",
    "PODS",
    "RESERVATIONS",
    "RESOURCECLAIMS",
    "RESOURCECLAIMTEMPLATES",
    "RESOURCESLICES",
    "STRATEGIC_MERGE_PATCH",
    "WORKLOADS",
    "ApiError",
    "Kind",
    "KubeApi",
    "ListPages",
    "Refused",
    "Result",
    "Written",
]

log = logging.getLogger(__name__)

JSON = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"
# RFC 6902: a list of operations; its `test` operations are the preconditions of the write.
JSON_PATCH = "application/json-patch+json"
# Built-in kinds only: merges lists by their patchMergeKey (a native PodGroup's conditions by type).
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
USER_AGENT = "topoalloc-allocator"


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
            yield from loads(raw).get("items") or []


async def _json(resp: aiohttp.ClientResponse, decode: bool = True) -> JSON:
    raw = await _body(resp)
    if not decode:
        return {}
    try:
        return loads(raw) if raw else {}
    except ValueError as exc:
        raise ApiError(resp.status, "InvalidResponse", f"response is not JSON: {exc}") from None


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

    async def server_time(self) -> float | None:
        """The API server's clock: the Date header of its answer to GET /version, in seconds since
        the epoch (None without one); to the second, as HTTP dates are."""
        resp = await self._send("GET", SERVER_VERSION)
        date = resp.headers.get("Date")
        await _body(resp)
        try:
            return email.utils.parsedate_to_datetime(date).timestamp() if date else None
        except (TypeError, ValueError):
            return None

    # -- writes: every one answers Written or Refused, and says a refusal here -------------------

    async def _write(
        self,
        method: str,
        path: str,
        body: Any,
        *,
        content_type: str = "application/json",
        query: dict[str, Any] | None = None,
        what: str | None,
        quiet: Collection[int] = (),
    ) -> Result:
        try:
            return Written(await self._call(method, path, body=body, query=query, content_type=content_type))
        except ApiError as exc:
            refused = Refused.of(exc)
        if what is not None and refused.status not in quiet:
            log.warning("%s: %s", what, refused)
        return refused

    async def patch(
        self,
        path: str,
        body: Any,
        *,
        what: str | None,
        content_type: str = MERGE_PATCH,
        query: dict[str, Any] | None = None,
        quiet: Collection[int] = (),
    ) -> Result:
        """PATCH the object at `path` (a `Kind.path`): a merge patch unless `content_type` says
        otherwise. Its preconditions (`metadata.uid` and `resourceVersion` in a merge patch, `test`
        operations in a JSON patch) are the caller's body, sent as they are.

        A refusal is logged at WARNING as "`what`: why", unless its status is in `quiet` or
        `what` is None (the caller reports it itself)."""
        return await self._write(
            "PATCH", path, body, content_type=content_type, query=query, what=what, quiet=quiet
        )

    async def create(self, path: str, body: JSON, *, what: str | None, quiet: Collection[int] = ()) -> Result:
        """POST `body` to the collection (or subresource: pods/eviction) at `path`."""
        return await self._write("POST", path, body, what=what, quiet=quiet)

    async def create_or_replace(self, kind: Kind, body: JSON, *, what: str | None) -> Result:
        """Make the object `body` names, or replace it (no resourceVersion: the last writer wins).
        Replaced first, created on NotFound: one request once the object exists."""
        meta = body.get("metadata") or {}
        namespace = meta.get("namespace", "") if kind.namespaced else ""
        path = kind.path(meta["name"], namespace=namespace)
        got = await self._write("PUT", path, body, what=what, quiet=(404,))
        if isinstance(got, Refused) and got.status == 404:
            return await self._write("POST", kind.path(namespace=namespace), body, what=what)
        return got

    # -- list / watch -----------------------------------------------------------------------------

    async def serves(self, kind: Kind) -> bool:
        """API discovery: whether the server serves `kind` in its group and version now."""
        try:
            found = await self._call("GET", kind.root)
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
                kind.path(),
                query={"limit": page_size, "continue": token},
                timeout=self.timeout * 6,
            )
            try:
                raw = await _body(resp)
                page = loads(raw)
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
        resp = await self._send("GET", kind.path(), query=query, timeout=float(timeout_seconds + 30))
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
                        yield loads(line)
            if buffer.strip():
                yield loads(bytes(buffer))
        except (aiohttp.ClientError, TimeoutError) as exc:
            # The stream broke (connection dropped, payload cut short): the caller resumes.
            raise ApiError(0, "Transport", str(exc) or type(exc).__name__) from exc

    # -- pods -------------------------------------------------------------------------------------

    async def get_pod(self, namespace: str, name: str) -> JSON:
        return await self._call("GET", PODS.path(name, namespace=namespace))

    async def patch_pod(self, namespace: str, name: str, patch: JSON) -> JSON:
        """RFC 7386 merge patch (a `null` value deletes the key)."""
        return await self._call(
            "PATCH", PODS.path(name, namespace=namespace), body=patch, content_type=MERGE_PATCH
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
        await self._call(
            "POST", PODS.path(name, namespace=namespace, subresource="binding"), body=body, decode=False
        )

    # -- leases ---------------------------------------------------------------------------------------

    async def get_lease(self, namespace: str, name: str) -> JSON | None:
        try:
            return await self.raw("GET", LEASES.path(name, namespace=namespace))
        except ApiError as exc:
            if exc.not_found:
                return None
            raise

    async def create_lease(self, namespace: str, lease: JSON) -> JSON:
        return await self.raw("POST", LEASES.path(namespace=namespace), body=lease)

    async def replace_lease(self, namespace: str, name: str, lease: JSON) -> JSON:
        """PUT with `metadata.resourceVersion` set: 409 if someone else wrote it first."""
        return await self.raw("PUT", LEASES.path(name, namespace=namespace), body=lease)
