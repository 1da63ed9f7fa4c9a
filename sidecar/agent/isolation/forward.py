"""exec's side of the namespace's sockets, served from the host's network namespace.

* mirrors: each connection to a mirrored loopback port (the sidecar's proxy, control
  API, PostgreSQL relay) is piped, byte for byte, to the same port on the host;
* transparent HTTP: a connection the nat rules redirected (a client that ignored the
  proxy variables) is read for its original destination (``SO_ORIGINAL_DST``) and
  handed to the sidecar's proxy as ``CONNECT HOST:PORT`` with the attempt's credentials -
  exactly what a proxy-honouring client sends, so the sidecar needs no transparent
  listener, binds the connection to the attempt, and sees the TLS SNI / Host header as
  usual; a routed name's stand-in address (:mod:`.resolv`) is named by its name;
* PostgreSQL (redirected, or to the relay's mirrored port): piped to the relay after a
  BindRequest naming the attempt (:func:`sidecar.pgwire.codec.bind_request`), so a
  client that sends no ``PGOPTIONS`` (asyncpg) is bound too - its own binding, if any,
  wins; the relay sends it to its ``--pg-upstream`` (it cannot see the original address);
* DNS: each UDP query is sent to the host's first nameserver and the answer returned.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import socket
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from sidecar.agent.isolation.netns import Namespace
from sidecar.pgwire.codec import bind_request
from sidecar.runtime.aio import spawn

log = logging.getLogger("sidecar.exec")

SO_ORIGINAL_DST = 80  # linux/netfilter_ipv4.h
CHUNK = 1 << 16
DNS_TIMEOUT_S = 5.0

type _Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@dataclass
class Forwarder:
    namespace: Namespace
    proxy: tuple[str, int]
    credentials: str  # "task:attempt", already percent-encoded where needed
    binding: tuple[str, str] | None = None  # (task, attempt): told to the relay
    routed: dict[str, str] = field(default_factory=dict)  # stand-in address -> name
    relay: tuple[str, int] | None = None
    nameserver: str | None = None
    _servers: list[asyncio.Server] = field(default_factory=list)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _dns: asyncio.DatagramTransport | None = None

    async def start(self) -> None:
        space = self.namespace
        preamble = bind_request(*self.binding) if self.binding else b""
        for (host, port), sock in space.mirrors.items():
            first = preamble if (host, port) == self.relay else b""
            self._servers.append(await self._serve(sock, self._mirror(host, port, first)))
        if space.http is not None:
            self._servers.append(await self._serve(space.http, self._transparent))
        if space.pg is not None and self.relay is not None:
            relay = self._mirror(*self.relay, preamble)
            self._servers.append(await self._serve(space.pg, relay))
        if space.dns is not None and self.nameserver:
            loop = asyncio.get_running_loop()
            transport, _ = await loop.create_datagram_endpoint(
                lambda: _DnsRelay(self.nameserver or "", self._tasks), sock=space.dns
            )
            self._dns = transport

    async def close(self) -> None:
        for server in self._servers:
            server.close()
        if self._dns is not None:
            self._dns.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _serve(self, sock: socket.socket, handler: _Handler) -> asyncio.Server:
        host, port = sock.getsockname()[:2]
        name = f"isolation connection to {host}:{port}"

        def tracked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            _hold(self._tasks, spawn(_guarded(handler, reader, writer), name=name))

        return await asyncio.start_server(tracked, sock=sock)

    def _mirror(self, host: str, port: int, first: bytes = b"") -> _Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            up_reader, up_writer = await asyncio.open_connection(host, port)
            up_writer.write(first)
            await _pipe_both(reader, writer, up_reader, up_writer)

        return handle

    async def _transparent(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        address, port = original_destination(writer.get_extra_info("socket"))
        name = self.routed.get(address, address)
        up_reader, up_writer = await asyncio.open_connection(*self.proxy)
        auth = base64.b64encode(self.credentials.encode()).decode()
        up_writer.write(
            f"CONNECT {name}:{port} HTTP/1.1\r\nHost: {name}:{port}\r\n"
            f"Proxy-Authorization: Basic {auth}\r\n\r\n".encode()
        )
        head = await up_reader.readuntil(b"\r\n\r\n")
        status = head.split(b" ", 2)[1:2]
        if status != [b"200"]:
            log.warning("the proxy refused a transparent connection to %s:%s: %r", name, port, head)
            up_writer.close()
            writer.close()
            return
        await _pipe_both(reader, writer, up_reader, up_writer)


def _hold(tasks: set[asyncio.Task[None]], task: asyncio.Task[None]) -> None:
    """Keep ``task`` in ``tasks`` (cancelled and awaited by :meth:`Forwarder.close`) while
    it runs."""
    tasks.add(task)
    task.add_done_callback(tasks.discard)


async def _guarded(
    handler: _Handler, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    try:
        await handler(reader, writer)
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as error:
        log.debug("isolated connection ended: %s", error)
    finally:
        writer.close()


def original_destination(sock: socket.socket) -> tuple[str, int]:
    """Where a redirected connection was going (IPv4 ``SO_ORIGINAL_DST``)."""
    raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    (port,) = struct.unpack("!H", raw[2:4])
    return socket.inet_ntoa(raw[4:8]), port


async def _pipe_both(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    up_reader: asyncio.StreamReader,
    up_writer: asyncio.StreamWriter,
) -> None:
    try:
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
    finally:
        up_writer.close()


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while data := await source.read(CHUNK):
            sink.write(data)
            await sink.drain()
        if sink.can_write_eof():
            sink.write_eof()  # half-close: the other direction may still be talking
    except OSError:
        sink.close()


class _DnsRelay(asyncio.DatagramProtocol):
    def __init__(self, nameserver: str, tasks: set[asyncio.Task[None]]) -> None:
        self.nameserver = nameserver
        self.tasks = tasks
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.DatagramTransport)
        self.transport = transport

    def datagram_received(self, data: bytes, addr: tuple[str | object, int]) -> None:
        _hold(self.tasks, spawn(self._ask(data, addr), name="isolation dns query"))

    async def _ask(self, query: bytes, client: tuple[str | object, int]) -> None:
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[bytes] = loop.create_future()

        class Asker(asyncio.DatagramProtocol):
            def datagram_received(self, data: bytes, addr: tuple[str | object, int]) -> None:
                if not answered.done():
                    answered.set_result(data)

        try:
            transport, _ = await loop.create_datagram_endpoint(
                Asker, remote_addr=(self.nameserver, 53)
            )
        except OSError:
            return
        try:
            transport.sendto(query)
            answer = await asyncio.wait_for(answered, DNS_TIMEOUT_S)
            if self.transport is not None:
                self.transport.sendto(answer, client)
        except TimeoutError:
            pass
        finally:
            transport.close()
