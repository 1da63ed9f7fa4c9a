"""The upstream client tells "never sent" from "maybe sent" over real sockets: only the
first lets the guard fail an effect instead of leaving its outcome unknown."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from yarl import URL

from sidecar.proxy.routes import Routes
from sidecar.proxy.upstream import Upstream, UpstreamError
from tests.support import certs
from tests.support.ports import free_port


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    client = Upstream(Routes.parse([]))
    await client.start()
    try:
        yield client
    finally:
        await client.close()


async def send(client: Upstream, url: str) -> UpstreamError:
    with pytest.raises(UpstreamError) as failed:
        await client.send("POST", URL(url), [("Host", "x")], b"{}", timeout_s=5)
    return failed.value


async def test_a_refused_connection_was_not_sent(upstream: Upstream) -> None:
    error = await send(upstream, f"http://127.0.0.1:{free_port()}/charges")
    assert error.sent is False
    assert "not sent" in str(error)


async def test_an_untrusted_certificate_was_not_sent(upstream: Upstream, tmp_path: Path) -> None:
    cert, key = certs.write_ca(tmp_path, *certs.make_ca("not trusted", ip="127.0.0.1"))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    requests_seen = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal requests_seen
        if await reader.read(1):
            requests_seen += 1
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    async with server:
        error = await send(upstream, f"https://127.0.0.1:{port}/charges")
    assert error.sent is False
    assert "CERTIFICATE_VERIFY_FAILED" in str(error)
    assert requests_seen == 0


async def test_a_connection_closed_after_the_request_may_have_been_sent(
    upstream: Upstream,
) -> None:
    received = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        received.set()
        writer.transport.abort()  # the request arrived; the answer never comes

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        error = await send(upstream, f"http://127.0.0.1:{port}/charges")
    assert received.is_set()
    assert error.sent is True


@pytest.mark.parametrize(
    "target",
    [
        "//elsewhere.test/steal?token=1",  # a path, not another host
        "/repos/acme/app/contents/a/../b",  # dot segments are the API's to read
        "/v1/./charges?expand[]=customer&note=%2F",  # query and escapes as they came
    ],
)
async def test_an_effect_goes_to_its_own_host_with_its_target_as_sent(target: str) -> None:
    request_lines: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        request_lines.append(head.split(b"\r\n", 1)[0])
        writer.write(b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = Upstream(Routes.parse([f"api.test=http://127.0.0.1:{port}"]))
    await client.start()
    try:
        async with server:
            url = client.url("https", "api.test", None, target)
            reply = await client.send("POST", url, [("Host", "api.test")], b"{}", timeout_s=5)
    finally:
        await client.close()
    assert reply.status == 201
    assert request_lines == [f"POST {target} HTTP/1.1".encode()]
