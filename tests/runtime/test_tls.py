"""Mutual TLS on real sockets: handshakes, the allowlist, and certificate rotation."""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from allocator.runtime import certs
from allocator.runtime.tls import ClientAllowlist, ReloadingTLS, client_auth_middleware, peer_identity
from tests.support.pki import Pki


class Server:
    def __init__(self, tls: ReloadingTLS, runner: web.AppRunner, port: int) -> None:
        self.tls = tls
        self.runner = runner
        self.url = f"https://127.0.0.1:{port}"
        self.port = port


async def start_server(pki: Pki, allowlist: ClientAllowlist | None = None) -> Server:
    tls = ReloadingTLS(pki.server)

    async def whoami(request: web.Request) -> web.Response:
        who = peer_identity(request.transport.get_extra_info("peercert"))
        return web.json_response(
            {"cn": list(who.common_names), "tls": request.transport.get_extra_info("ssl_object").version()}
        )

    app = web.Application(middlewares=[client_auth_middleware(allowlist or ClientAllowlist())])
    app.router.add_post("/filter", whoami)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls.context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return Server(tls, runner, port)


@pytest.fixture
async def server(pki: Pki) -> AsyncIterator[Server]:
    srv = await start_server(pki)
    yield srv
    await srv.runner.cleanup()


async def post(url: str, ctx: ssl.SSLContext) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s, s.post(url + "/filter", json={}, ssl=ctx) as r:
        return r.status, await r.text()


async def server_serial(port: int, ctx: ssl.SSLContext) -> int:
    """The serial number of the certificate the server presents to a new connection."""
    _reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.close()
    from cryptography import x509

    return x509.load_der_x509_certificate(der).serial_number


async def test_scheduler_client_is_served_over_tls13(pki: Pki, server: Server) -> None:
    status, body = await post(server.url, pki.client_context())
    assert status == 200
    assert certs.SCHEDULER_CLIENT_CN in body and "TLSv1.3" in body


async def test_client_without_certificate_is_rejected_at_handshake(pki: Pki, server: Server) -> None:
    with pytest.raises(aiohttp.ClientError):
        await post(server.url, pki.client_context(with_cert=False))


async def test_certificate_from_another_ca_is_rejected(pki: Pki, server: Server) -> None:
    rogue_ca = certs.make_ca("rogue-ca")
    rogue = pki.client_files(certs.scheduler_client_cert(rogue_ca), "rogue")
    with pytest.raises(aiohttp.ClientError):
        await post(server.url, pki.client_context(rogue))


async def test_expired_client_certificate_is_rejected(pki: Pki, server: Server) -> None:
    long_ago = dt.datetime.now(dt.UTC) - dt.timedelta(days=30)
    expired = pki.client_files(
        certs.issue(pki.ca, certs.SCHEDULER_CLIENT_CN, client=True, not_before=long_ago, days=1), "expired"
    )
    with pytest.raises(aiohttp.ClientError):
        await post(server.url, pki.client_context(expired))


async def test_server_only_certificate_cannot_be_used_as_client(pki: Pki, server: Server) -> None:
    # Extended key usage is enforced: a stolen server certificate does not authenticate a client.
    srv_only = pki.client_files(certs.issue(pki.ca, certs.SCHEDULER_CLIENT_CN, server=True), "srvonly")
    with pytest.raises(aiohttp.ClientError):
        await post(server.url, pki.client_context(srv_only))


async def test_tls_1_2_is_the_floor(pki: Pki, server: Server) -> None:
    assert server.tls.context.minimum_version == ssl.TLSVersion.TLSv1_2
    ctx = pki.client_context()
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2  # an older client still gets in at 1.2
    status, body = await post(server.url, ctx)
    assert status == 200 and "TLSv1.2" in body


@pytest.mark.parametrize(
    ("entries", "allowed"),
    [
        (["kube-scheduler-extender-client"], True),  # plain: CN or SAN
        (["CN=kube-scheduler-extender-client"], True),
        (["O=system:kube-scheduler"], True),
        (["system:kube-scheduler"], False),  # a plain entry never matches the organization
        (["CN=someone-else", "URI:spiffe://cluster.local/ns/kube-system/sa/kube-scheduler"], False),
        (["CN=someone-else"], False),
    ],
)
async def test_allowlist(pki: Pki, entries: list[str], allowed: bool) -> None:
    srv = await start_server(pki, ClientAllowlist(entries))
    try:
        status, body = await post(srv.url, pki.client_context())
    finally:
        await srv.runner.cleanup()
    if allowed:
        assert status == 200
    else:
        assert status == 403
        assert "not allowed" in body and "kube-scheduler-extender-client" in body


async def test_allowlist_matches_uri_san(pki: Pki) -> None:
    spiffe = "spiffe://cluster.local/ns/kube-system/sa/kube-scheduler"
    with_uri = pki.client_files(certs.issue(pki.ca, "scheduler", client=True, uris=[spiffe]), "spiffe")
    srv = await start_server(pki, ClientAllowlist([f"URI:{spiffe}"]))
    try:
        assert (await post(srv.url, pki.client_context(with_uri)))[0] == 200
        assert (await post(srv.url, pki.client_context()))[0] == 403
    finally:
        await srv.runner.cleanup()


async def test_rotated_server_certificate_is_served_without_restart(pki: Pki, server: Server) -> None:
    ctx = pki.client_context()
    old_serial = await server_serial(server.port, ctx)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
        # A keep-alive connection opened before the rotation...
        async with session.post(server.url + "/filter", json={}, ssl=ctx) as r:
            assert r.status == 200
        new = certs.server_cert(pki.ca, "topoalloc-allocator", "topoalloc-system", ip_addresses=["127.0.0.1"])
        new.write(pki.server.cert, pki.server.key)
        assert server.tls.reload_if_changed()
        # ...keeps working (the request is not dropped)...
        async with session.post(server.url + "/filter", json={}, ssl=ctx) as r:
            assert r.status == 200
    # ...and new connections get the new certificate.
    assert await server_serial(server.port, ctx) == new.cert.serial_number != old_serial
    assert server.tls.generation == 2


async def test_rotation_is_picked_up_by_the_file_watcher(pki: Pki, server: Server) -> None:
    watcher = asyncio.create_task(server.tls.watch(0.05))
    try:
        new = certs.server_cert(pki.ca, "topoalloc-allocator", "topoalloc-system", ip_addresses=["127.0.0.1"])
        new.write(pki.server.cert, pki.server.key)
        for _ in range(100):
            if server.tls.generation == 2:
                break
            await asyncio.sleep(0.02)
        assert await server_serial(server.port, pki.client_context()) == new.cert.serial_number
    finally:
        watcher.cancel()


async def test_half_written_rotation_keeps_the_old_certificate(pki: Pki, server: Server) -> None:
    ctx = pki.client_context()
    old_serial = await server_serial(server.port, ctx)
    new = certs.server_cert(pki.ca, "topoalloc-allocator", "topoalloc-system", ip_addresses=["127.0.0.1"])
    pki.server.cert.write_bytes(new.cert_pem)  # the key has not arrived yet
    assert not server.tls.reload_if_changed()
    assert server.tls.last_error
    assert await server_serial(server.port, ctx) == old_serial
    assert (await post(server.url, ctx))[0] == 200
    pki.server.key.write_bytes(new.key_pem)
    assert server.tls.reload_if_changed()
    assert await server_serial(server.port, ctx) == new.cert.serial_number


async def test_client_ca_rotation_swaps_trust(pki: Pki, server: Server) -> None:
    new_ca = certs.make_ca("next-ca")
    new_client = pki.client_files(certs.scheduler_client_cert(new_ca), "next-client")
    old_client_ctx = pki.client_context()
    assert (await post(server.url, old_client_ctx))[0] == 200
    with pytest.raises(aiohttp.ClientError):
        await post(server.url, pki.client_context(new_client))
    # The client CA bundle now holds only the new CA (the server certificate is unchanged).
    pki.server.client_ca.write_bytes(new_ca.cert_pem)
    assert server.tls.reload_if_changed()
    assert (await post(server.url, pki.client_context(new_client)))[0] == 200
    with pytest.raises(aiohttp.ClientError):
        await post(server.url, pki.client_context())
