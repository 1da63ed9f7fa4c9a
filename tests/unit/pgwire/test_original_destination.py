"""SO_ORIGINAL_DST in the relay: a direct connection is not mistaken for a redirected one
(the redirected case runs in tests/acceptance/kube/test_transparent_redirect.py)."""

from __future__ import annotations

import asyncio

from sidecar.pgwire.relay import original_destination


async def test_a_direct_loopback_connection_has_no_original_destination() -> None:
    seen: list[tuple[str, int] | None] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(original_destination(writer))
        writer.close()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(100):
        if seen:
            break
        await asyncio.sleep(0.01)
    writer.close()
    server.close()
    await server.wait_closed()
    assert seen == [None]
