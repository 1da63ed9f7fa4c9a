"""The PostgreSQL relay: accepts agents' connections and carries them to the real server.

Start-up is passed through untouched - authentication (trust, md5, SCRAM) happens
between the agent and the server, so the sidecar holds no database secret - except:

* SSLRequest / GSSENCRequest from the agent are answered ``N``: agents reach the sidecar
  over loopback in plaintext; the sidecar speaks TLS to the server when its upstream
  URL asks for it (``sslmode=require``);
* when that TLS link exists, ``SCRAM-SHA-256-PLUS`` is removed from the server's offer:
  channel binding would bind to the sidecar's TLS session, which the agent cannot see;
* the sidecar's own startup parameters (``-c sidecar.task=... -c sidecar.attempt=...``
  in ``options``, as `sidecar exec` sets PGOPTIONS, or ``sidecar.task`` /
  ``sidecar.attempt`` parameters) bind the connection to an attempt and are removed;
* a CancelRequest is sent on to the server (the agent was given the server's own key);
* a connection that iptables redirected to the relay (transparent mode, ``sidecar
  redirect``) is carried to the server the agent asked for, read from
  ``SO_ORIGINAL_DST`` (IPv4), as mitmproxy does for HTTP; ``--pg-upstream`` then only
  supplies the TLS setting, and is the server for connections made to the relay itself.

After start-up, :class:`sidecar.pgwire.session.Session` carries the conversation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
import ssl
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from sidecar.errors import ConfigError, StaleGeneration
from sidecar.pgwire import messages
from sidecar.pgwire.codec import (
    CANCEL_REQUEST,
    PROTOCOL_3,
    SSL_REQUEST,
    BackendReader,
    FrontendReader,
    ProtocolError,
    Startup,
    startup_packet,
)
from sidecar.recording.bindings import BindRequest

log = logging.getLogger("sidecar.pgwire")

# Authentication requests the client must answer: cleartext, md5, GSS, SSPI, SASL.
_ASKS_CLIENT = frozenset({3, 5, 7, 8, 9, 10, 11})
_SASL = 10
_SIDECAR_OPTION = re.compile(r"-c\s*sidecar\.(task|attempt)=(\S+)")
READ_SIZE = 1 << 16
SO_ORIGINAL_DST = 80  # linux/netfilter_ipv4.h; not in the socket module


@dataclass(frozen=True, slots=True)
class Upstream:
    host: str
    port: int
    tls: bool

    @classmethod
    def parse(cls, url: str) -> Upstream:
        parts = urlsplit(url)
        if parts.scheme not in {"postgresql", "postgres"} or not parts.hostname:
            raise ConfigError(f"--pg-upstream wants postgresql://HOST[:PORT], got {url!r}")
        if parts.username or parts.password:
            raise ConfigError("--pg-upstream takes no credentials: agents authenticate themselves")
        mode = parse_qs(parts.query).get("sslmode", ["disable"])[0]
        if mode not in {"disable", "require"}:
            raise ConfigError(f"--pg-upstream sslmode must be disable or require, not {mode!r}")
        return cls(parts.hostname, parts.port or 5432, mode == "require")


def split_binding(parameters: dict[str, str]) -> tuple[dict[str, str], BindRequest]:
    """The startup parameters to forward, and the binding taken out of them."""
    found: dict[str, str] = {}
    kept: dict[str, str] = {}
    for name, value in parameters.items():
        if name in {"sidecar.task", "sidecar.attempt"}:
            found[name.split(".", 1)[1]] = value
        elif name == "options":
            for key, val in _SIDECAR_OPTION.findall(value):
                found[key] = val
            rest = _SIDECAR_OPTION.sub("", value).strip()
            if rest:
                kept[name] = rest
        else:
            kept[name] = value
    return kept, BindRequest(found.get("task"), found.get("attempt"), "pg")


def original_destination(writer: asyncio.StreamWriter) -> tuple[str, int] | None:
    """Where the agent meant to connect, if iptables redirected it here; else None."""
    sock = writer.get_extra_info("socket")
    if sock is None or sock.family != socket.AF_INET:
        return None
    try:
        raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    except OSError:  # not NATed (or no conntrack): a direct connection
        return None
    port, packed = struct.unpack_from("!2xH4s", raw)
    target = (socket.inet_ntop(socket.AF_INET, packed), int(port))
    local = sock.getsockname()
    return None if target == (local[0], int(local[1])) else target


type SessionFactory = Callable[
    [asyncio.StreamReader, asyncio.StreamWriter, asyncio.StreamReader, asyncio.StreamWriter,
     FrontendReader, BackendReader, BindRequest, dict[str, str]],
    Awaitable[None],
]  # fmt: skip


# What a finished start-up hands to the session: the binding, the parameters forwarded,
# the authenticated server connection and its message reader.
type Started = tuple[
    BindRequest, dict[str, str], asyncio.StreamReader, asyncio.StreamWriter, BackendReader
]

# An open connection: the agent's side, the server's side, the server's messages.
type _Open = tuple[asyncio.StreamWriter, asyncio.StreamWriter, BackendReader]

# As PostgreSQL's authentication_timeout: a connection that has not finished its start-up
# and authentication by then is closed, so half-started connections cannot pile up.
AUTHENTICATION_TIMEOUT_S = 60.0


class Relay:
    def __init__(
        self,
        upstream: Upstream,
        session: SessionFactory,
        *,
        authentication_timeout_s: float = AUTHENTICATION_TIMEOUT_S,
    ) -> None:
        self.upstream = upstream
        self.session = session
        self.authentication_timeout_s = authentication_timeout_s
        self._server: asyncio.Server | None = None
        # attempt id -> its open connections: agent side, server side, server messages
        self._by_attempt: dict[str, set[_Open]] = {}

    async def start(self, host: str, port: int) -> tuple[str, int]:
        try:
            self._server = await asyncio.start_server(self._accept, host, port)
        except OSError as error:
            raise ConfigError(f"cannot listen on {host}:{port} for PostgreSQL: {error}") from error
        bound = self._server.sockets[0].getsockname()
        return str(bound[0]), int(bound[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._serve(reader, writer)
        except ProtocolError as error:
            log.warning("postgres connection closed: protocol violation: %s", error)
            with contextlib.suppress(Exception):
                text = f"effect-sidecar: invalid PostgreSQL protocol message: {error}"
                writer.write(messages.error_response("08P01", text, severity="FATAL"))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError) as error:
            log.info("postgres connection ended: %s", error)
        except Exception as unexpected:
            # SPEC §3.6 on the SQL path: the agent is told, and the server connection is
            # closed with the transaction open on it, so the server rolls back whatever
            # ran there together with its record - nothing stays done unrecorded.
            log.exception("postgres connection failed")
            with contextlib.suppress(Exception):
                text = (
                    f"effect-sidecar: internal error (sidecar_error): {unexpected!r}; the "
                    "connection is closed and its open transaction rolled back"
                )
                writer.write(messages.error_response("XX000", text, severity="FATAL"))
                await writer.drain()
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frontend = FrontendReader()
        started = await self._started(reader, writer, frontend)
        if started is None:
            return
        bind, parameters, up_reader, up_writer, backend = started
        pair = (writer, up_writer, backend)
        if bind.attempt_id is not None:
            self._by_attempt.setdefault(bind.attempt_id, set()).add(pair)
        try:
            await self.session(
                reader, writer, up_reader, up_writer, frontend, backend, bind, parameters
            )
        finally:
            # Whatever happened, the server connection goes: an open transaction on it
            # rolls back (a session that failed half-way leaves nothing done unrecorded).
            with contextlib.suppress(Exception):
                up_writer.close()
            if bind.attempt_id is not None:
                left = self._by_attempt.get(bind.attempt_id, set())
                left.discard(pair)
                if not left:
                    self._by_attempt.pop(bind.attempt_id, None)

    def close_attempt(self, stale: StaleGeneration) -> None:
        """Close the connections of an attempt that lost its lease while they are inside
        a transaction.  Fencing refuses its next statement anyway; closing also rolls back
        the transaction it left open (a worker frozen mid-transaction), whose row locks
        would otherwise stop the attempt that took over - on the very rows it must write.
        An idle connection stays: reads are not effects, and its next write is refused
        (and audited) like any stale write."""
        text = (
            f"effect-sidecar: attempt {stale.attempt_id} (generation {stale.generation}) of "
            f"task {stale.task} no longer holds the lease ({stale.reason}): its connection "
            "is closed and its open transaction rolled back"
        )
        for client, server, backend in list(self._by_attempt.get(stale.attempt_id, ())):
            if backend.transaction_status not in ("T", "E"):
                continue
            log.warning(
                "closing a PostgreSQL connection of attempt %s in a transaction: %s",
                stale.attempt_id, stale.reason,
                extra={"task": stale.task, "attempt_id": stale.attempt_id},
            )  # fmt: skip
            with contextlib.suppress(Exception):
                server.close()  # the server rolls the open transaction back
            with contextlib.suppress(Exception):
                client.write(messages.error_response("ES409", text, severity="FATAL"))
                client.close()

    async def _started(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, frontend: FrontendReader
    ) -> Started | None:
        """Start-up and authentication, within the authentication timeout: the binding, the
        parameters and the authenticated server connection, or None (the client was told)."""
        try:
            async with asyncio.timeout(self.authentication_timeout_s):
                return await self._start(reader, writer, frontend)
        except TimeoutError:
            log.info("postgres connection closed: start-up not finished in time")
            text = (
                "effect-sidecar: start-up and authentication not finished within "
                f"{self.authentication_timeout_s:g} s"
            )
            writer.write(messages.error_response("08P01", text, severity="FATAL"))
            with contextlib.suppress(Exception):
                await writer.drain()
            return None

    async def _start(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, frontend: FrontendReader
    ) -> Started | None:
        startup: Startup | None = None
        while startup is None or startup.code != PROTOCOL_3:
            data = await reader.read(READ_SIZE)
            if not data:
                return None
            startup = frontend.feed_startup(data)
            if startup is None:
                continue
            if startup.code == CANCEL_REQUEST:
                await self._cancel(startup, original_destination(writer))
                return None
            if startup.code != PROTOCOL_3:
                writer.write(b"N")  # no SSL, no GSS encryption on the loopback leg
                await writer.drain()
        parameters, bind = split_binding(startup.parameters)
        target = original_destination(writer)
        host, port = target or (self.upstream.host, self.upstream.port)
        try:
            up_reader, up_writer = await self._connect(target)
        except OSError as error:  # refused, unreachable, TLS refused or failed
            log.warning("postgres server %s:%s not reached: %s", host, port, error)
            text = f"effect-sidecar: cannot connect to the PostgreSQL server {host}:{port}"
            writer.write(messages.error_response("08001", f"{text}: {error}", severity="FATAL"))
            await writer.drain()
            return None
        try:
            up_writer.write(startup_packet(parameters))
            backend = BackendReader()
            if not await self._authenticate(
                reader, writer, up_reader, up_writer, frontend, backend
            ):
                up_writer.close()
                return None
        except BaseException:
            up_writer.close()
            raise
        frontend.authenticated()
        return bind, parameters, up_reader, up_writer, backend

    async def _connect(
        self, target: tuple[str, int] | None = None
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to ``target`` (a redirected agent's own server) or the upstream."""
        up = self.upstream
        host, port = target or (up.host, up.port)
        up_reader, up_writer = await asyncio.open_connection(host, port)
        if up.tls:
            up_writer.write(struct.pack("!ii", 8, SSL_REQUEST))
            await up_writer.drain()
            answer = await up_reader.read(1)
            if answer != b"S":
                up_writer.close()
                refusal = "does not accept TLS" if answer else "closed the connection"
                raise ConnectionError(f"it {refusal}, and --pg-upstream has sslmode=require")
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE  # sslmode=require: encrypted, not verified
            await up_writer.start_tls(context, server_hostname=up.host)
        return up_reader, up_writer

    async def _authenticate(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
        frontend: FrontendReader,
        backend: BackendReader,
    ) -> bool:
        """Relay the authentication exchange until the server's first ReadyForQuery."""
        # What the client sent along with its startup packet, framed (and so capped) like
        # the rest; an incomplete message stays buffered for _whole_messages.
        pending = frontend.feed(b"")
        if pending:
            up_writer.write(b"".join(m.raw for m in pending))
        while True:
            data = await up_reader.read(READ_SIZE)
            if not data:
                return False
            out = bytearray()
            ready = awaiting_client = False
            for m in backend.feed(data):
                if m.kind == b"R":
                    code = messages.auth_code(m)
                    awaiting_client = code in _ASKS_CLIENT
                    if code == _SASL and self.upstream.tls:
                        offer = messages.sasl_mechanisms(m)
                        m_raw = messages.sasl_offer([n for n in offer if n != "SCRAM-SHA-256-PLUS"])
                        out += m_raw
                        continue
                out += m.raw
                if m.kind == b"E":
                    writer.write(bytes(out))
                    await writer.drain()
                    return False
                ready = ready or m.kind == b"Z"
            writer.write(bytes(out))
            await writer.drain()
            if ready:
                return True
            if awaiting_client:
                answer = await _whole_messages(reader, frontend)
                if answer is None:
                    return False
                up_writer.write(answer)
                await up_writer.drain()

    async def _cancel(self, startup: Startup, target: tuple[str, int] | None) -> None:
        _, up_writer = await self._connect(target)  # over TLS too: the key is a secret
        up_writer.write(startup.raw)
        await up_writer.drain()
        up_writer.close()


async def _whole_messages(reader: asyncio.StreamReader, frontend: FrontendReader) -> bytes | None:
    """The client's next complete message(s): a password or SASL answer may come in pieces,
    and the server must get it whole before it says anything more (None: client gone)."""
    while True:
        data = await reader.read(READ_SIZE)
        if not data:
            return None
        complete = frontend.feed(data)
        if complete:
            return b"".join(m.raw for m in complete)
