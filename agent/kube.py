"""The few Kubernetes requests the agent makes, over the official `kubernetes` sync client.

Devices go through `CustomObjectsApi`. Nodes, pods and the DRA objects (ResourceSlices,
ResourceClaims) go through the same `ApiClient` (its configuration, authentication, TLS and
`ApiException`s) as raw JSON: importing `CoreV1Api` and deserialising into its pydantic models
would cost the agent about 20 MB of resident memory for objects it reads three fields of.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes.client import ApiClient
from kubernetes.client.api.custom_objects_api import CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from apis.device import GROUP, PLURAL, VERSION
from apis.kinds import CORE_EVENTS, NODES, PODS, RESOURCECLAIMS, RESOURCESLICES

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
TIMEOUT = (5.0, 20.0)  # connect, read
# What a failed request looks like: an HTTP error status, or no answer at all.
TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (ApiException, urllib3.exceptions.HTTPError, OSError)


def api_client(kubeconfig: str | None) -> ApiClient:
    """A client for the cluster: the given kubeconfig, else in-cluster, else the default kubeconfig."""
    from kubernetes import client, config

    configuration = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)
    else:
        config.load_kube_config(client_configuration=configuration)
    return client.ApiClient(configuration)


@dataclass
class Outcome:
    """What one publishing step did: whether it wrote, and the error that stopped it ("" if none)."""

    wrote: bool = False
    error: str = ""


def status_of(exc: BaseException) -> int:
    """The HTTP status of a failed request; 0 when the server never answered."""
    return int(getattr(exc, "status", 0) or 0) if isinstance(exc, ApiException) else 0


def another_pod(exc: BaseException) -> bool:
    """A write naming a pod's uid refused because the pod of that name is another one now: a
    precondition (409, a PUT or a binding) or, for a patch, the uid's change refused (422 naming
    metadata.uid: kube-apiserver takes a patched uid as a change, not as a precondition)."""
    status = status_of(exc)
    if status != 422:
        return status == 409
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        causes = (json.loads(getattr(exc, "body", None) or "{}").get("details") or {}).get("causes") or []
        return any(c.get("field") == "metadata.uid" for c in causes)
    return False


def short_error(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        message = ""
        with contextlib.suppress(ValueError, AttributeError):
            message = json.loads(exc.body or "{}").get("message", "")
        return f"HTTP {exc.status} {exc.reason or ''}".strip() + (f": {message}" if message else "")
    return f"{type(exc).__name__}: {exc}"


class Kube:
    def __init__(self, api_client: ApiClient) -> None:
        self.api = api_client
        self.custom = CustomObjectsApi(api_client)

    # -- raw JSON requests ------------------------------------------------------------------
    def _request(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, Any]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: Any = TIMEOUT,
        stream: bool = False,
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
        response = self.api.call_api(
            method, url, header_params=headers, body=serialized, _request_timeout=timeout
        )
        if stream:
            if not 200 <= response.status < 300:
                response.read()
                raise ApiException.from_response(
                    http_resp=response, body=response.data.decode("utf-8", "replace"), data=None
                )
            return response
        response.read()
        if not 200 <= response.status < 300:
            raise ApiException.from_response(
                http_resp=response, body=response.data.decode("utf-8", "replace"), data=None
            )
        return json.loads(response.data) if response.data else None

    # -- nodes ------------------------------------------------------------------------------
    def get_node(self, name: str) -> dict[str, Any]:
        return self._request("GET", NODES.path(name))

    def patch_node(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self._request("PATCH", NODES.path(name), body=patch, content_type=MERGE_PATCH)

    def patch_node_status(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self._request(
            "PATCH", NODES.path(name, subresource="status"), body=patch, content_type=MERGE_PATCH
        )

    # -- pods -------------------------------------------------------------------------------
    def list_pods_on(self, node: str) -> dict[str, Any]:
        return self._request("GET", PODS.path(), query=[("fieldSelector", f"spec.nodeName={node}")])

    def patch_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self._request(
            "PATCH", PODS.path(name, namespace=namespace), body=patch, content_type=MERGE_PATCH
        )

    def create_event(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._request("POST", CORE_EVENTS.path(namespace=namespace), body=body)

    def watch_pods_on(
        self, node: str, resource_version: str, timeout_seconds: int, opened: list[Any] | None = None
    ) -> Iterator[dict[str, Any]]:
        """Watch events for the pods bound to `node`, from `resource_version`, until the server ends.
        The open response is appended to `opened`, so another thread can shut the stream."""
        response = self._request(
            "GET",
            PODS.path(),
            query=[
                ("fieldSelector", f"spec.nodeName={node}"),
                ("watch", "true"),
                ("resourceVersion", resource_version),
                ("allowWatchBookmarks", "true"),
                ("timeoutSeconds", timeout_seconds),
            ],
            timeout=(TIMEOUT[0], timeout_seconds + 15),
            stream=True,
        )
        if opened is not None:
            opened.append(response.response)
        buffer = b""
        try:
            for chunk in response.response.stream(16384, decode_content=True):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)
        finally:
            response.response.release_conn()

    # -- devices ----------------------------------------------------------------------------
    def get_device(self, name: str) -> dict[str, Any]:
        return self.custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, name, _request_timeout=TIMEOUT)

    def create_device(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.custom.create_cluster_custom_object(
            GROUP, VERSION, PLURAL, body, _request_timeout=TIMEOUT
        )

    def replace_device(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.custom.replace_cluster_custom_object(
            GROUP, VERSION, PLURAL, name, body, _request_timeout=TIMEOUT
        )

    def replace_device_status(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.custom.replace_cluster_custom_object_status(
            GROUP, VERSION, PLURAL, name, body, _request_timeout=TIMEOUT
        )

    # -- DRA --------------------------------------------------------------------------------
    def server_version(self) -> dict[str, Any]:
        """The API server's /version (major, minor, gitVersion)."""
        return self._request("GET", "/version")

    def list_resource_slices(self, node: str, driver: str) -> dict[str, Any]:
        """The ResourceSlices of one driver on one node."""
        selector = f"spec.nodeName={node},spec.driver={driver}"
        return self._request("GET", RESOURCESLICES.path(), query=[("fieldSelector", selector)])

    def create_resource_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._request("POST", RESOURCESLICES.path(), body=body)

    def replace_resource_slice(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._request("PUT", RESOURCESLICES.path(name), body=body)

    def delete_resource_slice(self, name: str) -> None:
        self._request("DELETE", RESOURCESLICES.path(name))

    def get_resource_claim(self, namespace: str, name: str) -> dict[str, Any]:
        return self._request("GET", RESOURCECLAIMS.path(name, namespace=namespace))
