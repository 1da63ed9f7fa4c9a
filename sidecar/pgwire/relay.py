"""The PostgreSQL relay: accepts agents' connections and carries them to the real server.

Start-up is passed through untouched - authentication (trust, md5, SCRAM) happens
between the agent and the server, so the sidecar holds no database secret - except:

* SSLRequest: the relay asks the server first (SSLRequest); if it takes no TLS the
  agent is answered ``N`` too (as the server itself would answer it), else ``S``, a
  handshake with a certificate of the sidecar's CA for the name in the agent's SNI
  (:mod:`sidecar.pgwire.tls`), and TLS to the server, verified (name and chain: system
  roots or ``--pg-upstream-ca``) unless ``--pg-upstream`` has ``sslmode=require``; what
  fails toward the server is told to the agent as FATAL, over its TLS.  An agent that
  does not ask for TLS gets what ``--pg-upstream``'s ``sslmode`` says (plaintext unless
  ``require``/``verify-ca``/``verify-full``).  GSSENCRequest is answered ``N``;
* when the server link is TLS, ``SCRAM-SHA-256-PLUS`` is removed from the server's offer:
  channel binding would bind to the relay's TLS session, which the agent cannot see;
* the sidecar's own startup parameters (``-c sidecar.task=... -c sidecar.attempt=...``
  in ``options``, as `sidecar exec` sets PGOPTIONS, or ``sidecar.task`` /
  ``sidecar.attempt`` parameters) bind the connection to an attempt and are removed;
* a BindRequest (the sidecar's own start-up code, :data:`codec.BIND_REQUEST`) before
  anything else binds the connection when its startup parameters do not: ``sidecar
  exec`` sends it on the connections it carries from an isolated agent, which may be a
  client without ``PGOPTIONS`` (asyncpg) - it is as trusted as ``PGOPTIONS`` is;
* a CancelRequest is sent on to the server (the agent was given the server's own key);
* a connection that iptables redirected to the relay (transparent mode, ``sidecar
  redirect``) is carried to the server the agent asked for, read from
  ``SO_ORIGINAL_DST`` (IPv4), as mitmproxy does for HTTP; ``--pg-upstream`` then only
  supplies the TLS setting, and is the server for connections made to the relay itself.
  Such an agent asking for TLS gets a certificate for its SNI (else the address it
  meant), and that name is the one checked on the server's certificate.

The authentication timeout covers the TLS handshakes: a client that sends SSLRequest and
stalls is closed by it, without a plaintext word; one that sends garbage instead of a
ClientHello is closed at once.

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
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from sidecar.errors import ConfigError, StaleGeneration
from sidecar.pgwire import messages
from sidecar.pgwire.codec import (
    BIND_REQUEST,
    CANCEL_REQUEST,
    PROTOCOL_3,
    SSL_REQUEST,
    BackendReader,
    FrontendReader,
    ProtocolError,
    Startup,
    startup_packet,
)
from sidecar.pgwire.session import Idleness, Link
from sidecar.pgwire.tls import ALPN, LeafContext, RelayCertificates, host_name
from sidecar.recording.bindings import BindRequest
from sidecar.runtime.aio import spawn

log = logging.getLogger("sidecar.pgwire")

# Authentication requests the client must answer: cleartext, md5, GSS, SSPI, SASL.
_ASKS_CLIENT = frozenset({3, 5, 7, 8, 9, 10, 11})
_SASL = 10
_SIDECAR_OPTION = re.compile(r"-c\s*sidecar\.(task|attempt)=(\S+)")
READ_SIZE = 1 << 16
SO_ORIGINAL_DST = 80  # linux/netfilter_ipv4.h; not in the socket module


_SSLMODES = ("disable", "require", "verify-ca", "verify-full")


@dataclass(frozen=True, slots=True)
class Upstream:
    """The server, and how the relay speaks TLS to it.

    ``tls``: TLS on every connection, whether the agent asked for it or not (``sslmode``
    require, verify-ca or verify-full in the URL).  Without it, a connection is TLS to the
    server exactly when the agent's is TLS to the relay.  ``ca``: the CA (PEM) the
    server's certificate must chain to (``--pg-upstream-ca`` or ``sslrootcert=``), else
    the system's roots.
    """

    host: str
    port: int
    tls: bool
    sslmode: str = ""  # as the URL has it ("" when it names none)
    ca: Path | None = None

    @classmethod
    def parse(cls, url: str, ca: Path | None = None) -> Upstream:
        parts = urlsplit(url)
        if parts.scheme not in {"postgresql", "postgres"} or not parts.hostname:
            raise ConfigError(f"--pg-upstream wants postgresql://HOST[:PORT], got {url!r}")
        if parts.username or parts.password:
            raise ConfigError("--pg-upstream takes no credentials: agents authenticate themselves")
        query = parse_qs(parts.query)
        mode = query.get("sslmode", [""])[0]
        if mode and mode not in _SSLMODES:
            raise ConfigError(
                f"--pg-upstream sslmode must be one of {', '.join(_SSLMODES)}, not {mode!r}"
            )
        rootcert = query.get("sslrootcert", [""])[0]
        if rootcert and ca is not None and Path(rootcert) != ca:
            raise ConfigError(
                "the server's CA is given twice: --pg-upstream-ca and sslrootcert= in "
                "--pg-upstream; keep one"
            )
        if rootcert and rootcert != "system":
            ca = Path(rootcert)
        return cls(parts.hostname, parts.port or 5432, mode not in {"", "disable"}, mode, ca)

    @property
    def verification(self) -> str:
        """How the server's certificate is checked, as libpq would: ``none`` (sslmode
        require with no CA given), ``verify-ca`` (require with a CA, or verify-ca) or
        ``verify-full`` (verify-full, and a link made because the agent asked for TLS)."""
        if self.sslmode == "require":
            return "verify-ca" if self.ca is not None else "none"
        return "verify-ca" if self.sslmode == "verify-ca" else "verify-full"

    def client_context(self) -> ssl.SSLContext:
        """The context the relay's server connections use (a bad CA file: ConfigError)."""
        level = self.verification
        context = ssl.create_default_context(cafile=None)
        context.set_alpn_protocols(ALPN)
        if level == "none":
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE  # sslmode=require: encrypted, not verified
            return context
        if self.ca is not None:
            try:
                context = ssl.create_default_context(cafile=str(self.ca.expanduser()))
            except (OSError, ssl.SSLError) as error:
                raise ConfigError(
                    f"--pg-upstream-ca: cannot read CA certificates from {self.ca}: {error}"
                ) from error
            context.set_alpn_protocols(ALPN)
        # The server's certificate is checked as libpq checks it, not as strictly as
        # Python's default would (a self-made server certificate often lacks an AKI).
        context.verify_flags &= ~ssl.VERIFY_X509_STRICT
        context.check_hostname = level == "verify-full"
        return context


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


type SessionFactory = Callable[[Link, BindRequest, dict[str, str]], Awaitable[None]]


# What a finished start-up hands to the session: the binding, the parameters forwarded,
# the authenticated server connection and its message reader, and the server it is to
# (a redirected agent's own, or None: the upstream).
type Started = tuple[
    BindRequest,
    dict[str, str],
    asyncio.StreamReader,
    asyncio.StreamWriter,
    BackendReader,
    tuple[str, int] | None,
]

# As PostgreSQL's authentication_timeout: a connection that has not finished its start-up
# and authentication by then is closed, so half-started connections cannot pile up.
AUTHENTICATION_TIMEOUT_S = 60.0
#: How long a stopping relay lets the connections still open end on their own (a
#: statement running may finish, an agent may disconnect) before it closes them.
STOP_GRACE_S = 5.0
#: How often a stopping relay looks for connections that became idle, to close them.
STOP_POLL_S = 0.05
#: How long a stopping relay tries to ask the server to cancel a statement it cuts.
CANCEL_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class _Live:
    """A started connection: the attempt it acts for, both sides' streams, whether its
    session is idle, and how to cancel what it runs (the server's key data for it, and
    the server it is to) - what fencing and stopping close it by."""

    attempt_id: str | None
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    backend: BackendReader
    target: tuple[str, int] | None
    idle: Idleness


class Relay:
    def __init__(
        self,
        upstream: Upstream,
        session: SessionFactory,
        *,
        authentication_timeout_s: float = AUTHENTICATION_TIMEOUT_S,
        certificates: RelayCertificates | None = None,
    ) -> None:
        self.upstream = upstream
        self.session = session
        self.authentication_timeout_s = authentication_timeout_s
        # None: SSLRequest is answered N (no CA to present a certificate from)
        self.certificates = certificates
        # Built once (loading the roots costs): a bad --pg-upstream-ca stops start-up.
        self._client_context = upstream.client_context()
        self._server: asyncio.Server | None = None
        # Every connection's handler, from its start-up on (what stop() waits for), and
        # the connection once started (what fencing and stopping close).
        self._handlers: dict[asyncio.Task[Any], _Live | None] = {}

    async def start(self, host: str, port: int) -> tuple[str, int]:
        try:
            self._server = await asyncio.start_server(self._accept, host, port)
        except OSError as error:
            raise ConfigError(f"cannot listen on {host}:{port} for PostgreSQL: {error}") from error
        bound = self._server.sockets[0].getsockname()
        return str(bound[0]), int(bound[1])

    async def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop listening; give the connections still open up to ``grace_s`` to end, then
        close them.  The server rolls back a transaction left open on a closed connection,
        a statement's record with it, as when the sidecar is killed: nothing is done
        unrecorded, and the next attempt runs it again.  (Waiting for every agent to
        disconnect, as ``Server.wait_closed`` alone does, kept a sidecar with an agent's
        idle connection, or its COPY, open from ever stopping.)"""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        while self._handlers and (left_s := deadline - loop.time()) > 0:
            for handler, live in list(self._handlers.items()):
                if live is not None and not handler.cancelling() and live.idle():
                    handler.cancel()  # nothing to cut: closed at once
            await asyncio.wait(set(self._handlers), timeout=min(left_s, STOP_POLL_S))
        if busy := dict(self._handlers):
            log.info("closing %d PostgreSQL connection(s) still busy", len(busy))
            # A closed connection is noticed by the server only when the statement next
            # reads or writes it: cancelled, it rolls back now and frees its locks for
            # the attempt that runs it again.
            await asyncio.gather(*(self._cancel_running(live) for live in busy.values() if live))
            for handler in busy:
                handler.cancel()
            await asyncio.wait(busy, timeout=grace_s)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(server.wait_closed(), grace_s)

    async def _cancel_running(self, live: _Live) -> None:
        """Ask the server to cancel what the connection runs (best effort, bounded)."""
        key = live.backend.key_data
        if not key:
            return
        try:
            async with asyncio.timeout(CANCEL_TIMEOUT_S):
                _, up_writer = await self._connect(live.target)  # over TLS if it is
                up_writer.write(struct.pack("!ii", 8 + len(key), CANCEL_REQUEST) + key)
                await up_writer.drain()
                up_writer.close()
        except (OSError, TimeoutError) as error:
            log.warning("could not ask the server to cancel a statement cut: %s", error)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        assert handler is not None  # asyncio runs a client_connected_cb in a task
        self._handlers[handler] = None
        try:
            await self._serve(reader, writer, handler)
        except ProtocolError as error:
            log.warning("postgres connection closed: protocol violation: %s", error)
            with contextlib.suppress(Exception):
                text = f"effect-sidecar: invalid PostgreSQL protocol message: {error}"
                writer.write(messages.error_response("08P01", text, severity="FATAL"))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError) as error:
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
            self._handlers.pop(handler, None)
            with contextlib.suppress(Exception):
                writer.close()

    async def _serve(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        handler: asyncio.Task[Any],
    ) -> None:
        frontend = FrontendReader()
        started = await self._started(reader, writer, frontend)
        if started is None:
            return
        bind, parameters, up_reader, up_writer, backend, target = started
        try:
            link = Link(reader, writer, up_reader, up_writer, frontend, backend)
            self._handlers[handler] = _Live(
                bind.attempt_id, writer, up_writer, backend, target, link.idle
            )
            await self.session(link, bind, parameters)
        finally:
            # Whatever happened, the server connection goes: an open transaction on it
            # rolls back (a session that failed half-way leaves nothing done unrecorded).
            with contextlib.suppress(Exception):
                up_writer.close()

    def close_attempt(self, stale: StaleGeneration) -> None:
        """Close the connections of an attempt that lost its lease while they are inside
        a transaction.  Fencing refuses its next statement anyway; closing also rolls back
        the transaction it left open (a worker frozen mid-transaction), whose row locks
        would otherwise stop the attempt that took over - on the very rows it must write;
        a statement running there is cancelled on the server, which would otherwise
        notice the closed connection only when the statement next reads or writes it.
        An idle connection stays: reads are not effects, and its next write is refused
        (and audited) like any stale write."""
        text = (
            f"effect-sidecar: attempt {stale.attempt_id} (generation {stale.generation}) of "
            f"task {stale.task} no longer holds the lease ({stale.reason}): its connection "
            "is closed and its open transaction rolled back"
        )
        for live in list(self._handlers.values()):
            if live is None or live.attempt_id != stale.attempt_id:
                continue
            if live.backend.transaction_status not in ("T", "E"):
                continue
            log.warning(
                "closing a PostgreSQL connection of attempt %s in a transaction: %s",
                stale.attempt_id, stale.reason,
                extra={"task": stale.task, "attempt_id": stale.attempt_id},
            )  # fmt: skip
            spawn(self._cancel_running(live), name="pg-cancel-stale")
            with contextlib.suppress(Exception):
                live.server.close()  # the server rolls the open transaction back
            with contextlib.suppress(Exception):
                live.client.write(messages.error_response("ES409", text, severity="FATAL"))
                live.client.close()

    async def _started(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, frontend: FrontendReader
    ) -> Started | None:
        """Start-up and authentication, within the authentication timeout: the binding, the
        parameters and the authenticated server connection, or None (the client was told)."""
        leg = _Leg()
        try:
            async with asyncio.timeout(self.authentication_timeout_s):
                return await self._start(reader, writer, frontend, leg)
        except TimeoutError:
            log.info("postgres connection closed: start-up not finished in time")
            if leg.handshaking:
                return None  # the agent is mid-handshake: nothing it could read is sent
            text = (
                "effect-sidecar: start-up and authentication not finished within "
                f"{self.authentication_timeout_s:g} s"
            )
            writer.write(messages.error_response("08P01", text, severity="FATAL"))
            with contextlib.suppress(Exception):
                await writer.drain()
            return None

    async def _start(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        frontend: FrontendReader,
        leg: _Leg,
    ) -> Started | None:
        target = original_destination(writer)  # read before any TLS is layered on
        try:
            startup = await self._negotiate(reader, writer, frontend, target, leg)
            if startup is None:
                return None
            parameters, bind = split_binding(startup.parameters)
            if leg.bound_to and bind.task is None and bind.attempt_id is None:
                bind = BindRequest(*leg.bound_to, "pg")
            server = await self._server_for(writer, target, leg)
            if server is None:
                return None
            up_reader, up_writer = server
            up_writer.write(startup_packet(parameters))
            backend = BackendReader()
            if not await self._authenticate(
                reader, writer, up_reader, up_writer, frontend, backend, server_tls=leg.server_tls
            ):
                return None
            leg.server = None  # handed over to the session
        finally:
            if leg.server is not None:
                with contextlib.suppress(Exception):
                    leg.server[1].close()
        frontend.authenticated()
        return bind, parameters, up_reader, up_writer, backend, target

    async def _negotiate(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        frontend: FrontendReader,
        target: tuple[str, int] | None,
        leg: _Leg,
    ) -> Startup | None:
        """The requests before the StartupMessage (bind, TLS, GSS, cancel) answered; the
        StartupMessage, or None when the connection ends here."""
        startup: Startup | None = None
        seen = 0
        while startup is None or startup.code != PROTOCOL_3:
            startup = await _next_startup(reader, frontend)
            if startup is None:
                return None
            seen += 1
            if startup.code == BIND_REQUEST:
                if seen > 1:
                    raise ProtocolError("a BindRequest comes first or not at all")
                leg.bound_to = startup.bound_to
                continue
            if startup.code == CANCEL_REQUEST:
                await self._cancel(startup, target, leg)
                return None
            if startup.code == SSL_REQUEST and leg.agent_tls:
                raise ProtocolError("SSLRequest received over TLS")
            if startup.code == SSL_REQUEST and self.certificates and leg.server is None:
                if not await self._agent_tls(reader, writer, target, leg):
                    return None
            elif startup.code != PROTOCOL_3:
                writer.write(b"N")  # GSS encryption is never offered
                await writer.drain()
        return startup

    async def _server_for(
        self, writer: asyncio.StreamWriter, target: tuple[str, int] | None, leg: _Leg
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """The server connection for a started agent (None: the agent was told why not)."""
        if leg.error is None and leg.server is None:
            try:
                leg.server = await self._connect(target)
                leg.server_tls = self.upstream.tls
            except OSError as error:  # refused, unreachable, TLS refused or failed
                leg.error = str(error)
        if leg.error is None and leg.server is not None:
            return leg.server
        host, port = target or (self.upstream.host, self.upstream.port)
        log.warning("postgres server %s:%s not reached: %s", host, port, leg.error)
        text = f"effect-sidecar: cannot connect to the PostgreSQL server {host}:{port}"
        writer.write(messages.error_response("08001", f"{text}: {leg.error}", severity="FATAL"))
        await writer.drain()
        return None

    async def _agent_tls(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        target: tuple[str, int] | None,
        leg: _Leg,
    ) -> bool:
        """Answer the agent's SSLRequest as the server answers the relay's: ``N`` when it
        takes no TLS (the agent goes on in plaintext, or gives up as it would facing the
        server itself), else ``S`` and a handshake with a certificate of the sidecar's CA,
        then TLS to the server.  What fails on the server's side is kept in ``leg.error``
        and told to the agent, over TLS, once it has sent its startup packet.  False when
        the agent's handshake failed (the connection is closed)."""
        assert self.certificates is not None
        up = self.upstream
        host, port = target or (up.host, up.port)
        answer = b""
        try:
            leg.server = await asyncio.open_connection(host, port)
            leg.server[1].write(struct.pack("!ii", 8, SSL_REQUEST))
            await leg.server[1].drain()
            answer = await leg.server[0].read(1)
        except OSError as error:
            leg.error = str(error)
        if answer == b"N":
            # The server takes no TLS: neither does the relay, so the agent sees what it
            # would see connecting to the server (sslmode=prefer goes on in plaintext).
            if up.tls:
                leg.error = f"it does not accept TLS, and --pg-upstream has sslmode={up.sslmode}"
            writer.write(b"N")
            await writer.drain()
            return True
        if leg.error is None and answer != b"S":
            leg.error = "it closed the connection when asked for TLS"
        writer.write(b"S")
        await writer.drain()
        local = writer.get_extra_info("sockname")
        default = host_name(target[0] if target else str(local[0])) or "localhost"
        leg.handshaking = True
        try:
            await writer.start_tls(self.certificates.context_for(default))
        except (OSError, EOFError) as error:  # garbage instead of a ClientHello, or gone
            log.info("postgres connection closed: TLS handshake with the agent failed: %s", error)
            return False
        finally:
            leg.handshaking = False
        leg.agent_tls = True
        if leg.error is not None or leg.server is None:
            return True
        # The name checked on the server's certificate: the upstream's; for a redirected
        # agent, the name it asked for (its SNI), else the address it connected to.
        ssl_object = writer.get_extra_info("ssl_object")
        chosen = getattr(ssl_object, "context", None)
        name = chosen.name if target and isinstance(chosen, LeafContext) else up.host
        try:
            await leg.server[1].start_tls(self._client_context, server_hostname=name)
        except (OSError, EOFError) as error:
            leg.error = f"TLS to the server failed: {error}{self._ca_hint(error)}"
            return True
        leg.server_tls = True
        return True

    def _ca_hint(self, error: BaseException) -> str:
        if not isinstance(error, ssl.SSLCertVerificationError):
            return ""
        return (
            " (name the server's CA with --pg-upstream-ca FILE, or put sslmode=require in "
            "--pg-upstream to encrypt without verifying)"
        )

    async def _connect(
        self, target: tuple[str, int] | None = None
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to ``target`` (a redirected agent's own server) or the upstream,
        over TLS when ``--pg-upstream`` asks for it on every connection."""
        up = self.upstream
        host, port = target or (up.host, up.port)
        up_reader, up_writer = await asyncio.open_connection(host, port)
        if up.tls:
            try:
                up_writer.write(struct.pack("!ii", 8, SSL_REQUEST))
                await up_writer.drain()
                answer = await up_reader.read(1)
                if answer != b"S":
                    refusal = "does not accept TLS" if answer else "closed the connection"
                    raise ConnectionError(
                        f"it {refusal}, and --pg-upstream has sslmode={up.sslmode}"
                    )
                try:
                    await up_writer.start_tls(self._client_context, server_hostname=host)
                except ssl.SSLError as error:
                    raise ConnectionError(f"TLS to the server failed: {error}"
                                          f"{self._ca_hint(error)}") from error  # fmt: skip
            except BaseException:
                up_writer.close()
                raise
        return up_reader, up_writer

    async def _authenticate(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
        frontend: FrontendReader,
        backend: BackendReader,
        *,
        server_tls: bool,
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
            ready = awaiting_client = sasl_offered = False
            for m in backend.feed(data):
                if m.kind == b"R":
                    code = messages.auth_code(m)
                    awaiting_client = code in _ASKS_CLIENT
                    sasl_offered = code == _SASL
                    if code == _SASL and server_tls:
                        offer = messages.sasl_mechanisms(m)
                        m_raw = messages.sasl_offer([n for n in offer if n != "SCRAM-SHA-256-PLUS"])
                        out += m_raw
                        continue
                out += m.raw
                if m.kind == b"K":
                    backend.key_data = m.raw[5:]  # relayed as is: the agent's cancels work
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
                if sasl_offered and server_tls and _binding_expected(answer):
                    writer.write(
                        messages.error_response("28000", CHANNEL_BINDING, severity="FATAL")
                    )
                    await writer.drain()
                    return False
                up_writer.write(answer)
                await up_writer.drain()

    async def _cancel(self, startup: Startup, target: tuple[str, int] | None, leg: _Leg) -> None:
        if leg.server is not None and leg.error is None:
            up_writer = leg.server[1]  # made for the agent's SSLRequest: TLS if the agent's is
        else:
            _, up_writer = await self._connect(target)  # over TLS too: the key is a secret
        up_writer.write(startup.raw)
        await up_writer.drain()
        up_writer.close()


# libpq's default channel_binding=prefer, over TLS, answers a SCRAM offer without
# SCRAM-SHA-256-PLUS (the relay removes it: a binding to the relay's TLS session means
# nothing to the server) with "I could have bound, you did not offer it" - which a server
# that offers binding on its own TLS rightly refuses as a downgrade, with an error that
# names neither the relay nor the fix.  The relay says both, before the server is asked.
CHANNEL_BINDING = (
    "effect-sidecar: SCRAM channel binding cannot cross the sidecar's PostgreSQL relay "
    "(it terminates TLS): connect with channel_binding=disable (PGCHANNELBINDING=disable, "
    "which sidecar exec and the Kubernetes injector set), or connect to the server directly"
)


def _binding_expected(answer: bytes) -> bool:
    """Whether the client's SASLInitialResponse says it supports channel binding (GS2
    flag ``y``): the server link being TLS, the server would refuse it."""
    if answer[:1] != b"p" or len(answer) < 6:
        return False
    body = answer[5:]
    mechanism, _, rest = body.partition(b"\0")
    return mechanism == b"SCRAM-SHA-256" and rest[4:5] == b"y"


@dataclass(slots=True)
class _Leg:
    """One connection's start-up: its TLS on either side, and the server connection
    opened when the agent asked for TLS (or why it could not be made)."""

    agent_tls: bool = False
    handshaking: bool = False  # the agent's TLS handshake is under way
    server: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
    server_tls: bool = False
    error: str | None = None
    bound_to: tuple[str, str] | None = None  # (task, attempt) of a BindRequest


async def _next_startup(reader: asyncio.StreamReader, frontend: FrontendReader) -> Startup | None:
    """The client's next start-up message (it may have come with the one before, as an
    SSLRequest after a BindRequest does); None when the client hung up."""
    startup = frontend.feed_startup(b"")
    while startup is None:
        data = await reader.read(READ_SIZE)
        if not data:
            return None
        startup = frontend.feed_startup(data)
    return startup


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
