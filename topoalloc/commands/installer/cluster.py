"""The installer's requests to the API server, sent by the allocator's own client
(`allocator.runtime.kube.KubeApi`: kubeconfig, contexts, exec plugins, in-cluster, through
`kubernetes.aio`), as raw JSON with paths from the one table (apis/kinds.py).

The installer is a synchronous command; the client is asynchronous. `Cluster` keeps one event loop
(`asyncio.Runner`) and one client session for the command's life and runs each request on it, so
the installer and the allocator share one client (configuration, TLS, errors) without the
installer becoming async throughout; the command closes both when it ends.

Objects are applied with server-side apply under one field manager, so a later `upgrade` changes
exactly the fields the installer owns, and a field someone else set differently is a conflict the
user decides on (`--force-conflicts`), not silently overwritten.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar
from urllib.parse import quote

from allocator.runtime import kube
from allocator.runtime.kube import KubeApi
from apis.kinds import SERVER_VERSION, api_root
from topoalloc.commands.kube_access import config_error, require_kubeconfig
from topoalloc.errors import BadInput, Failure

FIELD_MANAGER = "topoalloc-installer"
APPLY_PATCH = "application/apply-patch+yaml"
TIMEOUT = 30.0  # seconds per request (applying a CRD may take a while)
Doc = dict[str, Any]
T = TypeVar("T")


class ApiError(Exception):
    """A request the API server refused, in the installer's words (`HTTP 403: <message>`)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status, self.message = status, message


def open_cluster(kubeconfig: str | None, context: str | None, in_cluster: bool) -> Cluster:
    """`connect`, closed when the command ends (every command that reads or changes a cluster
    through this client: install, upgrade, uninstall, doctor, explain)."""
    import click

    cluster = connect(kubeconfig, context, in_cluster)
    click.get_current_context().call_on_close(cluster.close)  # its client session and event loop
    return cluster


def answered(func: Callable[[], T], host: str) -> T:
    """`func()`, an API refusal nobody expected (RBAC refusing the user) said in one line as a
    runtime failure."""
    try:
        return func()
    except ApiError as exc:
        raise Failure("cluster", host, str(exc)) from None


def connect(kubeconfig: str | None, context: str | None, in_cluster: bool) -> Cluster:
    """A client for the cluster the flags name; bad input (no kubeconfig) is exit 2."""
    import yaml
    from kubernetes.aio.config import ConfigException

    path = None if in_cluster else require_kubeconfig(kubeconfig)
    runner = asyncio.Runner()
    try:
        api = runner.run(
            KubeApi.connect(kubeconfig=path, context=context, in_cluster=in_cluster, timeout=TIMEOUT)
        )
    except ConfigException as exc:
        runner.close()
        raise config_error(kubeconfig, exc, in_cluster=in_cluster) from None
    except yaml.YAMLError as exc:  # a file that is not YAML: bad input, said in one line
        runner.close()
        raise BadInput("kubeconfig", kubeconfig or "", " ".join(str(exc).split())) from None
    return Cluster(api, runner)


class Cluster:
    def __init__(self, api: KubeApi, runner: asyncio.Runner) -> None:
        self.api = api
        self.runner = runner
        self.host = api.host
        self._resources: dict[str, dict[str, tuple[str, bool]] | None] = {}

    def close(self) -> None:
        """The client's session, then the loop it runs on."""
        try:
            self.runner.run(self.api.close())
        finally:
            self.runner.close()

    # -- requests -----------------------------------------------------------------------------------

    def _run(self, call: Coroutine[Any, Any, T]) -> T:
        try:
            return self.runner.run(call)
        except kube.ApiError as exc:
            raise self._failure(exc) from None

    def _failure(self, exc: kube.ApiError) -> Exception:
        if exc.status == 0:
            return Failure("cluster", self.host, f"no answer: {exc.message or exc}")
        return ApiError(exc.status, exc.message or exc.reason)

    def request(
        self, method: str, path: str, *, body: Any = None, query: dict[str, Any] | None = None
    ) -> Any:
        return self._run(self.api.raw(method, path, body=body, query=query))

    def patch(self, path: str, body: Any, *, content_type: str, query: dict[str, Any] | None = None) -> Doc:
        got = self._run(self.api.patch(path, body, content_type=content_type, query=query, what=None))
        try:
            return got.or_raise().object
        except kube.ApiError as exc:  # said by the command, as every refusal
            raise self._failure(exc) from None

    def get(self, path: str) -> Doc | None:
        """The object, or None when it is not there."""
        try:
            return self.request("GET", path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def version(self) -> str:
        return str(self.request("GET", SERVER_VERSION)["gitVersion"])

    def server_time(self) -> float | None:
        """The API server's clock (seconds since the epoch), None when it does not say."""
        return self._run(self.api.server_time())

    # -- resources ----------------------------------------------------------------------------------

    def resource(self, api_version: str, kind: str) -> tuple[str, bool] | None:
        """(collection path prefix, namespaced) of a kind, from discovery; None when not served."""
        if api_version not in self._resources:
            base = api_root(api_version)
            found = self.get(base)
            self._resources[api_version] = (
                None
                if found is None
                else {
                    r["kind"]: (f"{base}/{r['name']}", bool(r.get("namespaced")))
                    for r in found.get("resources") or []
                    if "/" not in r["name"]
                }
            )
        table = self._resources[api_version]
        return None if table is None else table.get(kind)

    def forget_discovery(self) -> None:
        """After CRDs were created: their kinds are served now."""
        self._resources.clear()

    def path(self, api_version: str, kind: str, name: str = "", namespace: str = "") -> str | None:
        found = self.resource(api_version, kind)
        if found is None:
            return None
        prefix, namespaced = found
        if namespaced and namespace:
            group, _, tail = prefix.rpartition("/")
            prefix = f"{group}/namespaces/{quote(namespace)}/{tail}"
        return f"{prefix}/{quote(name)}" if name else prefix

    def doc_path(self, doc: Doc) -> str:
        meta = doc.get("metadata") or {}
        path = self.path(doc["apiVersion"], doc["kind"], meta["name"], meta.get("namespace", ""))
        if path is None:
            raise Failure(doc["kind"], meta["name"], f"the cluster does not serve {doc['apiVersion']}")
        return path

    def list(self, api_version: str, kind: str, *, selector: str = "", namespace: str = "") -> list[Doc]:
        path = self.path(api_version, kind, namespace=namespace)
        if path is None:
            return []
        query = {"labelSelector": selector} if selector else None
        items = []
        for item in (self.request("GET", path, query=query) or {}).get("items") or []:
            item.setdefault("apiVersion", api_version)
            item.setdefault("kind", kind)
            items.append(item)
        return items

    def apply(self, doc: Doc, *, force: bool = False, dry_run: bool = False) -> Doc:
        query = {"fieldManager": FIELD_MANAGER, "force": force, "dryRun": "All" if dry_run else None}
        return self.patch(self.doc_path(doc), doc, content_type=APPLY_PATCH, query=query)

    def delete(self, doc: Doc) -> bool:
        """Delete (in the background for dependents); False when it was not there."""
        try:
            self.request(
                "DELETE",
                self.doc_path(doc),
                body={"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"},
            )
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def merge_patch(self, path: str, body: Doc) -> Doc:
        return self.patch(path, body, content_type=kube.MERGE_PATCH)

    def items(self, path: str, selector: str = "") -> Iterator[Doc]:
        query = {"labelSelector": selector} if selector else None
        yield from (self.request("GET", path, query=query) or {}).get("items") or []
