"""The installer's few requests to the API server, over the official `kubernetes` client's
configuration (kubeconfig, contexts, exec plugins, in-cluster) and its urllib3 pool, as raw JSON.

Objects are applied with server-side apply under one field manager, so a later `upgrade` changes
exactly the fields the installer owns, and a field someone else set differently is a conflict the
user decides on (`--force-conflicts`), not silently overwritten.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import urllib3
from kubernetes.client import ApiClient, Configuration
from kubernetes.client.exceptions import ApiException
from kubernetes.config import ConfigException

from topoalloc.commands.kube_access import config_error, require_kubeconfig
from topoalloc.errors import Failure

FIELD_MANAGER = "topoalloc-installer"
TIMEOUT = (5.0, 30.0)
Doc = dict[str, Any]


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status, self.message = status, message


def connect(kubeconfig: str | None, context: str | None, in_cluster: bool) -> Cluster:
    """A client for the cluster the flags name; bad input (no kubeconfig) is exit 2."""
    from kubernetes import config

    configuration = Configuration()
    try:
        if in_cluster:
            config.load_incluster_config(client_configuration=configuration)
        else:
            path = require_kubeconfig(kubeconfig)
            config.load_kube_config(config_file=path, context=context, client_configuration=configuration)
    except ConfigException as exc:
        raise config_error(kubeconfig, exc, in_cluster=in_cluster) from None
    return Cluster(ApiClient(configuration))


class Cluster:
    def __init__(self, api: ApiClient) -> None:
        self.api = api
        self.host = str(api.configuration.host)
        self._resources: dict[str, dict[str, tuple[str, bool]] | None] = {}

    # -- requests -----------------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: list[tuple[str, Any]] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        _, url, headers, serialized, _ = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=query or [],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            response = self.api.call_api(
                method, url, header_params=headers, body=serialized, _request_timeout=TIMEOUT
            )
            response.read()
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise Failure("cluster", self.host, f"no answer: {exc}") from None
        except ApiException as exc:  # raised for some statuses by the client itself
            raise ApiError(int(exc.status or 0), str(exc.reason or exc)) from None
        if not 200 <= response.status < 300:
            raise ApiError(response.status, _message(response.data))
        return json.loads(response.data) if response.data else None

    def get(self, path: str) -> Doc | None:
        """The object, or None when it is not there."""
        try:
            return self.request("GET", path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def version(self) -> str:
        return str(self.request("GET", "/version")["gitVersion"])

    # -- resources ----------------------------------------------------------------------------------

    def resource(self, api_version: str, kind: str) -> tuple[str, bool] | None:
        """(collection path prefix, namespaced) of a kind, from discovery; None when not served."""
        if api_version not in self._resources:
            base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
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
        query = [("labelSelector", selector)] if selector else []
        items = []
        for item in (self.request("GET", path, query=query) or {}).get("items") or []:
            item.setdefault("apiVersion", api_version)
            item.setdefault("kind", kind)
            items.append(item)
        return items

    def apply(self, doc: Doc, *, force: bool = False, dry_run: bool = False) -> Doc:
        query: list[tuple[str, Any]] = [
            ("fieldManager", FIELD_MANAGER),
            ("force", "true" if force else "false"),
        ]
        if dry_run:
            query.append(("dryRun", "All"))
        return self.request(
            "PATCH", self.doc_path(doc), body=doc, query=query, content_type="application/apply-patch+yaml"
        )

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
        return self.request("PATCH", path, body=body, content_type="application/merge-patch+json")

    def items(self, path: str, selector: str = "") -> Iterator[Doc]:
        query = [("labelSelector", selector)] if selector else []
        yield from (self.request("GET", path, query=query) or {}).get("items") or []


def _message(data: bytes) -> str:
    try:
        return str(json.loads(data).get("message") or data.decode(errors="replace"))
    except (ValueError, AttributeError):
        return data.decode(errors="replace")[:300]
