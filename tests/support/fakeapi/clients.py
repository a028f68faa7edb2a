"""Official `kubernetes` client objects (sync and `kubernetes.aio`) pointed at a fake server's URL.

The imports are local: `kubernetes.client` loads hundreds of pydantic models, which tests that never
build a client should not pay for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import kubernetes.aio.client as aio_client
    import kubernetes.client as sync_client


def sync_configuration(url: str) -> sync_client.Configuration:
    import kubernetes.client

    return kubernetes.client.Configuration(host=url)


def sync_api_client(url: str) -> sync_client.ApiClient:
    """A sync ApiClient; close it (or use it as a context manager) when done."""
    import kubernetes.client

    return kubernetes.client.ApiClient(sync_configuration(url))


def aio_configuration(url: str) -> aio_client.Configuration:
    import kubernetes.aio.client

    # The fake listens on loopback: never route it through a proxy taken from the environment.
    return kubernetes.aio.client.Configuration(host=url, client_session_kwargs={"trust_env": False})


def aio_api_client(url: str) -> aio_client.ApiClient:
    """A `kubernetes.aio` ApiClient; `await client.close()` (or `async with`) when done."""
    import kubernetes.aio.client

    return kubernetes.aio.client.ApiClient(aio_configuration(url))
